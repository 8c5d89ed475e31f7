// The code cache end to end with the real compiler: compile, load, hit, key changes, corruption,
// compiler errors, several translation units, parallel builds, concurrent processes.
// Every test uses its own fresh cache directory under the build directory, never ~/.cache.

#include "codecache/code_cache.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codecache/loaded_library.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::codecache {
namespace {

namespace fs = std::filesystem;

// A fresh directory named after the running test.
fs::path fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" /
                 (std::string("codecache-") + info->test_suite_name() + "-" + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Sets an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string returning(const std::string& name, int value) {
  return "extern \"C\" int " + name + "() { return " + std::to_string(value) + "; }\n";
}

const char* kAddSource = "extern \"C\" int add(int a, int b) { return a + b; }\n";

std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(CodeCache, CompilesLoadsAndCalls) {
  CodeCache cache(fresh_dir() / "cache");
  fs::path library = cache.compile_shared_library(kAddSource);
  EXPECT_TRUE(fs::is_regular_file(library));
  EXPECT_TRUE(fs::is_regular_file(library.parent_path() / "manifest"));
  EXPECT_EQ(files::read(library.parent_path() / "kernel.cpp"), kAddSource);
  EXPECT_EQ(library.parent_path().parent_path().parent_path(), cache.dir());

  LoadedLibrary loaded(library);
  EXPECT_EQ(loaded.symbol<int(int, int)>("add")(2, 3), 5);
  CacheStats stats = cache.stats();
  EXPECT_EQ(stats.compiles, 1u);
  EXPECT_EQ(stats.hits, 0u);
  EXPECT_EQ(stats.compiler_runs, 1u);
}

TEST(CodeCache, SecondCompileOfSameSourceIsAHit) {
  fs::path dir = fresh_dir() / "cache";
  CodeCache cache(dir);
  fs::path first = cache.compile_shared_library(kAddSource);
  fs::path second = cache.compile_shared_library(kAddSource);
  EXPECT_EQ(first, second);
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().compiler_runs, 1u);

  // A new cache object (as in a new process) on the same directory runs no compiler either.
  CodeCache again(dir);
  EXPECT_EQ(again.compile_shared_library(kAddSource), first);
  EXPECT_EQ(again.stats().hits, 1u);
  EXPECT_EQ(again.stats().compiler_runs, 0u);
}

TEST(CodeCache, KeyDependsOnFlagsSourceAndExtraKey) {
  CodeCache cache(fresh_dir() / "cache");
  CompilerConfig o3;
  CompilerConfig o2;
  o2.flags = {"-O2", "-shared", "-fPIC", "-std=c++17"};
  CompilerConfig salted;
  salted.extra_key = "runtime-headers-v2";
  std::vector<SourceUnit> source = {{"kernel.cpp", kAddSource}};
  std::string key = cache.key(source, o3);
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(cache.key(source, o3), key);
  EXPECT_NE(cache.key(source, o2), key);
  EXPECT_NE(cache.key(source, salted), key);
  EXPECT_NE(cache.key({{"kernel.cpp", std::string(kAddSource) + "\n"}}, o3), key);
  EXPECT_NE(cache.key({{"other.cpp", kAddSource}}, o3), key);

  fs::path a = cache.compile_shared_library(source, o3);
  fs::path b = cache.compile_shared_library(source, o2);
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.stats().compiles, 2u);
  EXPECT_EQ(LoadedLibrary(b).symbol<int(int, int)>("add")(4, 5), 9);
}

TEST(CodeCache, CorruptEntriesAreDetectedAndRebuilt) {
  CodeCache cache(fresh_dir() / "cache");
  fs::path library = cache.compile_shared_library(kAddSource);
  fs::path manifest = library.parent_path() / "manifest";

  // A truncated library.
  fs::resize_file(library, fs::file_size(library) / 2);
  EXPECT_EQ(cache.compile_shared_library(kAddSource), library);
  EXPECT_EQ(cache.stats().rebuilds, 1u);
  EXPECT_EQ(LoadedLibrary(library).symbol<int(int, int)>("add")(1, 1), 2);

  // Same size, different bytes.
  std::string bytes = files::read(library);
  bytes[bytes.size() / 2] ^= 0x5a;
  files::write_atomic(library, bytes);
  cache.compile_shared_library(kAddSource);
  EXPECT_EQ(cache.stats().rebuilds, 2u);

  // A missing library, then a missing manifest, then a truncated manifest.
  fs::remove(library);
  cache.compile_shared_library(kAddSource);
  fs::remove(manifest);
  cache.compile_shared_library(kAddSource);
  std::string text = files::read(manifest);
  files::write_atomic(manifest, text.substr(0, text.size() / 2));
  cache.compile_shared_library(kAddSource);

  CacheStats stats = cache.stats();
  EXPECT_EQ(stats.rebuilds, 5u);
  EXPECT_EQ(stats.compiles, 6u);
  EXPECT_EQ(stats.hits, 0u);
  EXPECT_EQ(cache.compile_shared_library(kAddSource), library);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(LoadedLibrary(library).symbol<int(int, int)>("add")(20, 22), 42);
}

// Compiles broken.cpp (`text`, which uses the undefined `name`) and checks the UserError: it names
// the source kept in <key>.failed and quotes the compiler; nothing is installed. Returns the
// compiler output kept beside the source.
std::string expect_compiler_error(CodeCache& cache, const std::string& text,
                                  const std::string& name) {
  std::vector<SourceUnit> source = {{"broken.cpp", text}};
  std::string message = message_of([&] { cache.compile_shared_library(source); });
  fs::path kept = cache.entry_dir(cache.key(source, {})).string() + ".failed";
  EXPECT_NE(message.find((kept / "broken.cpp").string()), std::string::npos) << message;
  EXPECT_NE(message.find(name), std::string::npos) << message;
  EXPECT_NE(message.find("error"), std::string::npos) << message;
  EXPECT_EQ(files::read(kept / "broken.cpp"), source[0].text);
  EXPECT_TRUE(fs::is_regular_file(kept / "compiler-output.txt"));
  EXPECT_FALSE(fs::exists(cache.entry_dir(cache.key(source, {}))));
  EXPECT_EQ(cache.stats().compiles, 0u);
  return files::read(kept / "compiler-output.txt");
}

TEST(CodeCache, CompilerErrorNamesTheKeptSourceAndQuotesTheCompiler) {
  CodeCache cache(fresh_dir() / "cache");
  expect_compiler_error(cache, "extern \"C\" int f() { return undefined_thing_42; }\n",
                        "undefined_thing_42");
}

// KILN_PCH_DIR: a unit's leading #include lines are precompiled once and shared by caches. The
// probe header changes after the first build without changing the key (headers are not hashed,
// CompilerConfig::extra_key says so): a library built from the precompiled prefix still sees the
// old text, which shows that the .gch was used rather than the header parsed again. (The probe
// has an include guard: GCC compares a #pragma once header with the one in the .gch and would
// include the new text as another file, a redefinition, compiled again without the prefix.)
TEST(CodeCache, PrecompiledPrefixIsBuiltOnceAndSharedBetweenCaches) {
  fs::path dir = fresh_dir();
  fs::create_directories(dir / "include");
  files::write_atomic(
      dir / "include" / "probe.h",
      "#ifndef PROBE_H\n#define PROBE_H\ninline int probe() { return 1; }\n#endif\n");
  CompilerConfig config;
  config.include_dirs = {dir / "include"};
  const std::string prefix =
      "// a generated unit\n#include <numeric>\n\n#include \"probe.h\"\n#include <vector>\n";
  CodeCache first(dir / "a", 2, dir / "pch");
  fs::path library = first.compile_shared_library(
      {{"sum.cpp", prefix + "\nextern \"C\" int sum(int n) {\n"
                            "  std::vector<int> v(n);\n  std::iota(v.begin(), v.end(), 1);\n"
                            "  return std::accumulate(v.begin(), v.end(), probe());\n}\n"}},
      config);
  EXPECT_EQ(LoadedLibrary(library).symbol<int(int)>("sum")(4), 11);
  EXPECT_EQ(first.stats().pch_builds, 1u);
  EXPECT_EQ(first.stats().compiler_runs, 1u);
  std::vector<fs::path> headers;
  for (const auto& entry : fs::directory_iterator(dir / "pch")) {
    if (fs::is_regular_file(entry.path() / "prefix.h.gch")) headers.push_back(entry.path());
  }
  ASSERT_EQ(headers.size(), 1u);
  // The leading #include lines alone: the comment would give each unit its own header.
  EXPECT_EQ(files::read(headers[0] / "prefix.h"),
            "#include <numeric>\n#include \"probe.h\"\n#include <vector>\n");

  files::write_atomic(
      dir / "include" / "probe.h",
      "#ifndef PROBE_H\n#define PROBE_H\ninline int probe() { return 2; }\n#endif\n");
  CodeCache second(dir / "b", 2, dir / "pch");
  library = second.compile_shared_library(
      {{"wrapper.cpp",
        "// another unit\n" + prefix + "extern \"C\" int twice() { return 2 * probe(); }\n"},
       {"other.cpp", "extern \"C\" int three() { return 3; }\n"}},
      config);
  LoadedLibrary loaded(library);
  EXPECT_EQ(loaded.symbol<int()>("twice")(), 2);  // probe() of the precompiled prefix
  EXPECT_EQ(loaded.symbol<int()>("three")(), 3);
  EXPECT_EQ(second.stats().pch_builds, 0u);
  EXPECT_EQ(second.stats().compiler_runs, 3u);  // two objects and one link

  // Without KILN_PCH_DIR the header is parsed: the new text.
  CodeCache plain(dir / "c", 2, fs::path());
  library = plain.compile_shared_library(
      {{"wrapper.cpp", prefix + "extern \"C\" int twice() { return 2 * probe(); }\n"}}, config);
  EXPECT_EQ(LoadedLibrary(library).symbol<int()>("twice")(), 4);
  EXPECT_EQ(plain.stats().pch_builds, 0u);
}

// A unit that fails with its precompiled prefix is compiled again without it: the error is the
// plain compile's, naming the kept source, and the command kept with it has no -include.
TEST(CodeCache, CompilerErrorWithAPrecompiledPrefixIsThePlainCompilesError) {
  fs::path dir = fresh_dir();
  CodeCache cache(dir / "cache", 2, dir / "pch");
  std::string output = expect_compiler_error(
      cache, "#include <vector>\nextern \"C\" int f() { return undefined_thing_43; }\n",
      "undefined_thing_43");
  EXPECT_NE(output.find("broken.cpp"), std::string::npos) << output;
  EXPECT_EQ(output.find("-include"), std::string::npos) << output;
  EXPECT_EQ(cache.stats().pch_builds, 1u);
  EXPECT_EQ(cache.stats().compiler_runs, 2u);  // with the prefix, then without
}

TEST(CodeCache, LinkErrorIsAUserErrorToo) {
  CodeCache cache(fresh_dir() / "cache");
  CompilerConfig config;
  config.libraries = {"kiln_no_such_library"};
  std::string message = message_of([&] { cache.compile_shared_library(kAddSource, config); });
  EXPECT_NE(message.find("kiln_no_such_library"), std::string::npos) << message;
  EXPECT_NE(message.find("source kept at"), std::string::npos) << message;
}

TEST(CodeCache, SeveralTranslationUnitsLinkIntoOneLibrary) {
  CodeCache cache(fresh_dir() / "cache");
  std::vector<SourceUnit> sources = {
      {"helper.cpp", "int helper(int x) { return x * 10; }\n"},
      {"main", "int helper(int);\nextern \"C\" int run(int x) { return helper(x) + 1; }\n"},
      {"third.cc", "extern \"C\" int third() { return 3; }\n"},
  };
  fs::path library = cache.compile_shared_library(sources);
  LoadedLibrary loaded(library);
  EXPECT_EQ(loaded.symbol<int(int)>("run")(4), 41);
  EXPECT_EQ(loaded.symbol<int()>("third")(), 3);
  EXPECT_TRUE(fs::is_regular_file(library.parent_path() / "main.cpp"));
  EXPECT_EQ(cache.stats().compiler_runs, 4u);  // three objects and one link
  EXPECT_THROW(cache.compile_shared_library({{"a.cpp", ""}, {"a.cpp", ""}}), InternalError);
}

// A shared source is compiled once into an object that every library of the config links (each
// library its own copy of the object's hidden state); its text enters the libraries' keys, and a
// new text is a new object.
TEST(CodeCache, SharedSourceIsCompiledOnceAndLinkedIntoEveryLibrary) {
  const fs::path dir = fresh_dir();
  const fs::path shared = dir / "counter.cpp";
  files::write_atomic(shared,
                      "__attribute__((visibility(\"hidden\"))) int next_count() {\n"
                      "  static int count = 0;\n  return ++count;\n}\n");
  CompilerConfig config;
  config.shared_sources = {shared};
  const std::string uses =
      "__attribute__((visibility(\"hidden\"))) int next_count();\n"
      "extern \"C\" int tick() { return next_count(); }\n";
  CodeCache cache(dir / "cache");
  const std::string plain_key = cache.key({{"kernel.cpp", uses}}, CompilerConfig{});
  const std::string key = cache.key({{"kernel.cpp", uses}}, config);
  EXPECT_NE(key, plain_key);
  const fs::path one = cache.compile_shared_library(uses, config);
  const fs::path two = cache.compile_shared_library(
      {{"a.cpp", uses}, {"b.cpp", "extern \"C\" int other() { return 7; }\n"}}, config);
  EXPECT_EQ(cache.stats().compiler_runs, 5u);  // the object, one library, two objects and a link
  LoadedLibrary first(one), second(two);
  EXPECT_EQ(first.symbol<int()>("tick")(), 1);
  EXPECT_EQ(first.symbol<int()>("tick")(), 2);
  EXPECT_EQ(second.symbol<int()>("tick")(), 1);  // a counter of its own
  EXPECT_EQ(second.symbol<int()>("other")(), 7);

  // Another cache object on the same directory finds the object; a changed text is compiled anew
  // and changes the key.
  files::write_atomic(shared, files::read(shared) + "int unused_helper() { return 0; }\n");
  CodeCache again(dir / "cache");
  EXPECT_NE(again.key({{"kernel.cpp", uses}}, config), key);
  LoadedLibrary third(again.compile_shared_library(uses, config));
  EXPECT_EQ(third.symbol<int()>("tick")(), 1);
  EXPECT_EQ(again.stats().compiler_runs, 2u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "cache" / "objects"), {}), 4);  // 2 + locks

  // A shared source that does not compile is a UserError naming it.
  files::write_atomic(shared, "int broken( {\n");
  EXPECT_NE(message_of([&] { again.compile_shared_library(uses, config); }).find("counter.cpp"),
            std::string::npos);
}

TEST(CodeCache, CompileManyBuildsIndependentLibrariesInParallel) {
  CodeCache cache(fresh_dir() / "cache", 4);
  std::vector<LibrarySpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back({{{"value.cpp", returning("value", i)}}, {}});
  specs.push_back(specs[2]);  // a duplicate is built once
  std::vector<fs::path> paths = cache.compile_many(specs);
  ASSERT_EQ(paths.size(), specs.size());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(LoadedLibrary(paths[i]).symbol<int()>("value")(), i);
  }
  EXPECT_EQ(paths[6], paths[2]);
  EXPECT_EQ(cache.stats().compiles, 6u);
  EXPECT_EQ(cache.stats().hits, 1u);

  cache.compile_many(specs);
  EXPECT_EQ(cache.stats().compiles, 6u);
  EXPECT_EQ(cache.stats().hits, 8u);
}

TEST(CodeCache, CompileManyReportsAFailure) {
  CodeCache cache(fresh_dir() / "cache", 2);
  std::vector<LibrarySpec> specs = {{{{"good.cpp", returning("good", 1)}}, {}},
                                    {{{"bad.cpp", "this is not C++"}}, {}}};
  EXPECT_NE(message_of([&] { cache.compile_many(specs); }).find("bad.cpp"), std::string::npos);
}

// Run in a forked child: waits for the go file, compiles, loads, calls, records what happened.
int compile_in_child(const fs::path& dir, int index, const std::string& source) {
  try {
    while (!fs::exists(dir / "go")) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CodeCache cache(dir / "cache");
    fs::path library = cache.compile_shared_library(source);
    int value = LoadedLibrary(library).symbol<int()>("answer")();
    CacheStats stats = cache.stats();
    files::write_atomic(
        dir / ("result-" + std::to_string(index)),
        fmt::format("{} {} {} {}", stats.compiles, stats.hits, value, library.string()));
    return 0;
  } catch (const std::exception& error) {
    files::write_atomic(dir / ("result-" + std::to_string(index)), error.what());
    return 1;
  }
}

TEST(CodeCache, TwoProcessesCompilingTheSameSourceBuildItOnce) {
  fs::path dir = fresh_dir();
  std::string source = returning("answer", 42);
  std::vector<pid_t> children;
  for (int i = 0; i < 2; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(compile_in_child(dir, i, source));
    children.push_back(pid);
  }
  files::write_atomic(dir / "go", "go");
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::size_t compiles = 0;
  std::size_t hits = 0;
  std::vector<std::string> libraries;
  for (int i = 0; i < 2; ++i) {
    std::string text = files::read(dir / ("result-" + std::to_string(i)));
    std::istringstream in(text);
    std::size_t c = 0, h = 0;
    int value = 0;
    std::string library;
    ASSERT_TRUE(in >> c >> h >> value >> library) << text;
    compiles += c;
    hits += h;
    EXPECT_EQ(value, 42);
    libraries.push_back(library);
  }
  EXPECT_EQ(compiles, 1u);
  EXPECT_EQ(hits, 1u);
  EXPECT_EQ(libraries[0], libraries[1]);
  // One entry directory and its lock file; no temporaries left behind.
  fs::path shard = fs::path(libraries[0]).parent_path().parent_path();
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(shard)) {
    names.push_back(item.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::string key = fs::path(libraries[0]).parent_path().filename().string();
  EXPECT_EQ(names, (std::vector<std::string>{key, key + ".lock"}));
}

TEST(CodeCache, MissingCompilerIsAClearError) {
  ScopedEnv cxx("CXX", "/nonexistent/g++");
  CompilerConfig config;
  EXPECT_EQ(config.compiler, "/nonexistent/g++");
  CodeCache cache(fresh_dir() / "cache");
  std::string message = message_of([&] { cache.compile_shared_library(kAddSource, config); });
  EXPECT_NE(message.find("'/nonexistent/g++' not found"), std::string::npos) << message;
  EXPECT_NE(message.find("CXX"), std::string::npos) << message;

  config.compiler = "kiln-no-such-compiler";
  message = message_of([&] { cache.compile_shared_library(kAddSource, config); });
  EXPECT_NE(message.find("kiln-no-such-compiler"), std::string::npos) << message;
}

TEST(CodeCache, CompilerIdentityIsResolvedAndRemembered) {
  const CompilerIdentity& id = compiler_identity("g++");
  EXPECT_TRUE(id.path.is_absolute());
  EXPECT_FALSE(id.version.empty());
  EXPECT_FALSE(id.machine.empty());
  EXPECT_EQ(&compiler_identity("g++"), &id);
}

// A compiler for one test case: the shell script DIR/NAME/cxx, which logs its arguments to
// cxx.log, then runs `body` (by default g++ on them). Linker choices are remembered per compiler,
// so each case needs one of its own.
fs::path compiler_script(const fs::path& dir, const std::string& name,
                         const std::string& body = "exec g++ \"$@\"\n") {
  const fs::path script = dir / name / "cxx";
  fs::create_directories(script.parent_path());
  files::write_atomic(script, "#!/bin/sh\necho \"$@\" >> \"$0.log\"\n" + body);
  fs::permissions(script, fs::perms::owner_all);
  return script;
}

// Whether g++ runs the linker named by its -fuse-ld= name here.
bool gxx_runs_linker(const std::string& linker) {
  return std::system(("g++ -fuse-ld=" + linker + " -Wl,--version >/dev/null 2>&1").c_str()) == 0;
}

// The link runs the linker KILN_LINKER names; one the compiler cannot run is left out with a
// warning; unset, gold, else lld, where the compiler runs them. Each case uses a compiler of its
// own (a script that logs its arguments and runs g++), since the choice is remembered per
// compiler.
TEST(CodeCache, LinkerFollowsKilnLinker) {
  const fs::path dir = fresh_dir();
  // The library's link line (the one naming the library's objects), from the script's log.
  auto link_line = [](const fs::path& script) {
    std::istringstream log(files::read(script.string() + ".log"));
    std::string line, link;
    while (std::getline(log, line)) {
      if (line.find("unit.cpp.o") != std::string::npos) link = line;
    }
    return link;
  };
  auto build = [&](const fs::path& script, const char* linker) {
    ScopedEnv env("KILN_LINKER", linker);
    CodeCache cache(dir / script.parent_path().filename() / "cache");
    CompilerConfig config;
    config.compiler = script.string();
    fs::path library = cache.compile_shared_library(
        {{"unit.cpp", returning("seven", 7)}, {"other.cpp", returning("eight", 8)}}, config);
    LoadedLibrary loaded(library);
    EXPECT_EQ(loaded.symbol<int()>("seven")(), 7);
  };
  const fs::path bfd = compiler_script(dir, "bfd");
  build(bfd, "bfd");
  EXPECT_NE(link_line(bfd).find("-fuse-ld=bfd"), std::string::npos) << link_line(bfd);

  const fs::path missing = compiler_script(dir, "missing");
  ::testing::internal::CaptureStderr();
  build(missing, "kiln-no-such-linker");
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("KILN_LINKER=kiln-no-such-linker"), std::string::npos) << warning;
  EXPECT_EQ(link_line(missing).find("-fuse-ld"), std::string::npos) << link_line(missing);

  const fs::path own = compiler_script(dir, "default");
  build(own, "default");
  EXPECT_EQ(link_line(own).find("-fuse-ld"), std::string::npos) << link_line(own);

  const fs::path unset = compiler_script(dir, "unset");
  build(unset, nullptr);
  const std::string expected = gxx_runs_linker("gold")  ? "-fuse-ld=gold"
                               : gxx_runs_linker("lld") ? "-fuse-ld=lld"
                                                        : "";
  if (expected.empty()) {
    EXPECT_EQ(link_line(unset).find("-fuse-ld"), std::string::npos) << link_line(unset);
  } else {
    EXPECT_NE(link_line(unset).find(expected), std::string::npos) << link_line(unset);
  }
}

// A compiler whose driver answers the linker probe (-Wl,--version) with any linker but whose links
// fail with a -fuse-ld= option, as g++ 13 under /opt/gcc does with gold (a dangling libstdc++.so
// symlink that GNU ld passes over). Kiln's own choice of linker is then dropped for the default;
// one the user asked for by KILN_LINKER is not; and a link that fails for a reason of its own (a
// missing library) is reported without dropping it.
TEST(CodeCache, ALinkerOfKilnsChoiceThatFailsGivesWayToTheDefault) {
  if (!gxx_runs_linker("gold") && !gxx_runs_linker("lld")) {
    GTEST_SKIP() << "g++ runs neither gold nor lld here";
  }
  const fs::path dir = fresh_dir();
  auto failing_compiler = [&](const std::string& name) {
    return compiler_script(dir, name,
                           "case \" $* \" in *\" -Wl,--version \"*) exec g++ \"$@\";; esac\n"
                           "case \" $* \" in *\" -fuse-ld=\"*)\n"
                           "  echo 'ld: error: cannot open libstdc++.so' >&2; exit 1;; esac\n"
                           "exec g++ \"$@\"\n");
  };
  auto log_lines = [](const fs::path& script) {
    std::istringstream log(files::read(script.string() + ".log"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) lines.push_back(line);
    return lines;
  };
  auto links_with = [](const std::vector<std::string>& lines, const std::string& what) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.find(".so") != std::string::npos && line.find(" -c ") == std::string::npos &&
             line.find("linker-probe") == std::string::npos && line.find(what) != std::string::npos;
    });
  };

  const fs::path script = failing_compiler("chosen");
  ScopedEnv unset("KILN_LINKER", nullptr);
  CodeCache cache(dir / "chosen" / "cache");
  CompilerConfig config;
  config.compiler = script.string();
  // One unit: compiled and linked by one command, which fails with the linker and then passes
  // without it.
  LoadedLibrary one(cache.compile_shared_library({{"unit.cpp", returning("seven", 7)}}, config));
  EXPECT_EQ(one.symbol<int()>("seven")(), 7);
  std::vector<std::string> lines = log_lines(script);
  EXPECT_EQ(links_with(lines, "-fuse-ld="), 1);
  EXPECT_EQ(links_with(lines, "unit.cpp"), 2);
  // Two units, another key: the link runs once, with the default linker from the start.
  LoadedLibrary two(cache.compile_shared_library(
      {{"a.cpp", returning("eight", 8)}, {"b.cpp", returning("nine", 9)}}, config));
  EXPECT_EQ(two.symbol<int()>("eight")() + two.symbol<int()>("nine")(), 17);
  lines = log_lines(script);
  EXPECT_EQ(links_with(lines, "-fuse-ld="), 1);
  EXPECT_EQ(links_with(lines, "a.cpp.o"), 1);

  // Asked for by name, the linker is kept, and its failure is the build's.
  const fs::path asked = failing_compiler("asked");
  ScopedEnv gold("KILN_LINKER", gxx_runs_linker("gold") ? "gold" : "lld");
  CodeCache asked_cache(dir / "asked" / "cache");
  config.compiler = asked.string();
  try {
    asked_cache.compile_shared_library({{"unit.cpp", returning("seven", 7)}}, config);
    ADD_FAILURE() << "a failing link with the linker KILN_LINKER names built a library";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot open libstdc++.so"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(links_with(log_lines(asked), "-fuse-ld="), 1);
  EXPECT_EQ(links_with(log_lines(asked), "unit.cpp"), 1);

  // A plain g++ (behind a logging script) and a library that does not exist: one link, whose
  // error is the build's; the next library still links with Kiln's choice.
  ScopedEnv chosen_again("KILN_LINKER", nullptr);
  const fs::path plain = compiler_script(dir, "plain");
  CodeCache plain_cache(dir / "plain" / "cache");
  config.compiler = plain.string();
  config.libraries = {"kiln_no_such_library"};
  EXPECT_THROW(plain_cache.compile_shared_library({{"unit.cpp", returning("seven", 7)}}, config),
               UserError);
  EXPECT_EQ(links_with(log_lines(plain), "unit.cpp"), 1);
  config.libraries.clear();
  LoadedLibrary three(
      plain_cache.compile_shared_library({{"unit.cpp", returning("ten", 10)}}, config));
  EXPECT_EQ(three.symbol<int()>("ten")(), 10);
  lines = log_lines(plain);
  EXPECT_NE(lines.back().find("-fuse-ld="), std::string::npos) << lines.back();
}

TEST(CodeCache, DefaultCacheDirectoryFollowsTheEnvironment) {
  {
    ScopedEnv dir("KILN_CACHE_DIR", "/some/where");
    EXPECT_EQ(default_cache_dir(), fs::path("/some/where"));
  }
  ScopedEnv no_dir("KILN_CACHE_DIR", nullptr);
  {
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), fs::path("/home/someone/.cache/kiln"));
  }
  ScopedEnv no_home("HOME", nullptr);
  EXPECT_EQ(default_cache_dir(), fs::path("/tmp/kiln-cache-" + std::to_string(::getuid())));
}

TEST(CodeCache, CompileThreadsFollowTheEnvironment) {
  {
    ScopedEnv threads("KILN_COMPILE_THREADS", "3");
    EXPECT_EQ(default_compile_threads(), 3u);
  }
  {
    ScopedEnv threads("KILN_COMPILE_THREADS", "zero");
    EXPECT_THROW(default_compile_threads(), UserError);
  }
  ScopedEnv threads("KILN_COMPILE_THREADS", nullptr);
  EXPECT_GE(default_compile_threads(), 1u);
}

TEST(CodeCache, SanitizersFromTheEnvironmentAreFlagsAndEnterTheKey) {
  std::vector<std::string> plain;
  {
    ScopedEnv none("KILN_SANITIZE", nullptr);
    plain = default_jit_flags();
    EXPECT_TRUE(sanitizer_flags_from_env().empty());
  }
  ScopedEnv sanitize("KILN_SANITIZE", "address,undefined");
  std::vector<std::string> flags = default_jit_flags();
  EXPECT_NE(std::find(flags.begin(), flags.end(), "-fsanitize=address,undefined"), flags.end());
  EXPECT_NE(std::find(flags.begin(), flags.end(), "-fno-sanitize-recover=all"), flags.end());
  CompilerConfig sanitized, unsanitized;
  unsanitized.flags = plain;
  CodeCache cache(fresh_dir() / "cache");
  std::vector<SourceUnit> source = {{"kernel.cpp", kAddSource}};
  EXPECT_NE(cache.key(source, sanitized), cache.key(source, unsanitized));
  ScopedEnv bogus("KILN_SANITIZE", "address,memory");
  std::string message = message_of([] { default_jit_flags(); });
  EXPECT_NE(message.find("KILN_SANITIZE='address,memory': 'memory' is not a sanitizer"),
            std::string::npos)
      << message;
}

TEST(LoadedLibrary, MissingSymbolAndMissingFileAreClearErrors) {
  CodeCache cache(fresh_dir() / "cache");
  LoadedLibrary loaded(cache.compile_shared_library(kAddSource));
  EXPECT_TRUE(loaded.has_symbol("add"));
  EXPECT_FALSE(loaded.has_symbol("subtract"));
  std::string message = message_of([&] { loaded.symbol<int(int, int)>("subtract"); });
  EXPECT_NE(message.find("'subtract'"), std::string::npos) << message;
  EXPECT_NE(message.find(loaded.path().string()), std::string::npos) << message;

  LoadedLibrary moved = std::move(loaded);
  EXPECT_EQ(moved.symbol<int(int, int)>("add")(1, 2), 3);

  message = message_of([] { LoadedLibrary("/nonexistent/libkiln.so"); });
  EXPECT_NE(message.find("/nonexistent/libkiln.so"), std::string::npos) << message;
}

}  // namespace
}  // namespace kiln::codecache
