// An LD_PRELOAD library that makes a process see an x86-64-v3 (AVX2) CPU on an AVX-512 host, so
// that ONNX Runtime picks the kernels it would run on an AVX2 machine (it has no switch of its
// own; it reads CPUID). bench/ort/run.sh loads it into ONNX Runtime's process when Kiln's
// x86-64-v3 variant is forced (BENCH_ORT_VARIANT=v3), so both sides run AVX2 code.
//
// How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, on CPUs and hypervisors that offer it:
// the cpuid_fault flag in /proc/cpuinfo) makes every CPUID instruction of the process raise
// SIGSEGV. The handler turns CPUID back on for a moment, executes it, clears the AVX-512 and AMX
// feature bits of leaf 7 and steps over the instruction. The setting is per thread and inherited
// by threads created afterwards; the constructor runs before the program starts any.
//
// With AVX2_CPUID_CHECK=1 in the environment the constructor prints one line to stderr saying
// whether AVX-512F is hidden (run.sh checks it before trusting the shim).
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static int set_cpuid_enabled(int enabled) {
  return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, (unsigned long)enabled);
}

// Leaf 7, subleaf 0: EBX bits AVX512F (16), DQ (17), IFMA (21), PF (26), ER (27), CD (28),
// BW (30), VL (31); ECX bits VBMI (1), VBMI2 (6), VNNI (11), BITALG (12), VPOPCNTDQ (14); EDX
// bits 4VNNIW (2), 4FMAPS (3), VP2INTERSECT (8), AMX-BF16 (22), AVX512-FP16 (23), AMX-TILE (24),
// AMX-INT8 (25). Subleaf 1: EAX bits AVX-VNNI (4), AVX512-BF16 (5).
static const uint32_t kLeaf7Ebx = (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) |
                                  (1u << 28) | (1u << 30) | (1u << 31);
static const uint32_t kLeaf7Ecx = (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14);
static const uint32_t kLeaf7Edx =
    (1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25);
static const uint32_t kLeaf7Sub1Eax = (1u << 4) | (1u << 5);

static void on_segv(int sig, siginfo_t* info, void* context) {
  (void)info;
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* regs = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)regs[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {
    // A real fault: let it happen again with the default action (a core dump, as without us).
    signal(sig, SIG_DFL);
    return;
  }
  const uint32_t leaf = (uint32_t)regs[REG_RAX], subleaf = (uint32_t)regs[REG_RCX];
  uint32_t a, b, c, d;
  set_cpuid_enabled(1);
  __cpuid_count(leaf, subleaf, a, b, c, d);
  set_cpuid_enabled(0);
  if (leaf == 7 && subleaf == 0) {
    b &= ~kLeaf7Ebx;
    c &= ~kLeaf7Ecx;
    d &= ~kLeaf7Edx;
  } else if (leaf == 7 && subleaf == 1) {
    a &= ~kLeaf7Sub1Eax;
  }
  regs[REG_RAX] = a;
  regs[REG_RBX] = b;
  regs[REG_RCX] = c;
  regs[REG_RDX] = d;
  regs[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_avx512(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  const int ok = sigaction(SIGSEGV, &action, NULL) == 0 && set_cpuid_enabled(0) == 0;
  const char* check = getenv("AVX2_CPUID_CHECK");
  if (check && strcmp(check, "1") == 0) {
    uint32_t a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    fprintf(stderr, "avx2_cpuid: %s\n",
            ok && !(b & (1u << 16)) ? "AVX-512 hidden" : "CPUID faulting unavailable");
  }
}
