#!/usr/bin/python3
"""Every standard library name a file uses comes from a header the file includes itself.

A header that reaches std::string only through <thread> or <map> compiles with one standard
library and not with the next: GCC 13's <thread> no longer brings <string> in, so a file that
leaned on it failed to compile there while g++ 12 passed it. The runtime headers are compiled
by the user's compiler, whichever it is, and Kiln itself may be built with a newer one than
g++ 12, so no file may lean on such chains.

Usage: std_includes.py FILE_OR_DIR...  (directories: their .h and .cpp files, recursively)
Prints each file, std:: name and the headers that would declare it; exits 1 when there is any,
or when a name is missing from the table below (add it there).
"""
import os
import re
import sys

# Each name and the headers any of which declares it (the first is the one to include).
HEADERS = {
    "algorithm": ["clamp", "copy", "copy_n", "count", "equal", "fill", "fill_n", "find",
                  "find_if", "max", "max_element", "min", "min_element", "partial_sort",
                  "reverse", "sort", "stable_sort", "transform", "unique", "upper_bound",
                  "lower_bound", "all_of", "any_of", "none_of", "remove_if", "count_if",
                  "stable_partition", "shuffle", "rotate", "nth_element", "mismatch", "merge",
                  "lexicographical_compare", "includes", "adjacent_find"],
    "bit": ["bit_cast", "endian"],
    "cctype": ["tolower", "toupper", "isupper", "islower", "isalpha", "isalnum", "isdigit",
               "isspace"],
    "charconv": ["from_chars", "to_chars"],
    "array": ["array"],
    "atomic": ["atomic", "memory_order_relaxed", "memory_order_acquire", "memory_order_release",
               "memory_order_acq_rel", "memory_order_seq_cst", "atomic_thread_fence"],
    "chrono": ["chrono", "chrono_literals"],
    "cmath": ["ceil", "copysign", "cos", "erf", "exp", "expm1", "fabs", "floor", "fmod", "isfinite",
              "isinf", "isnan", "log", "log1p", "log2", "nearbyint", "pow", "round", "sin", "sqrt",
              "tanh", "trunc", "lround", "llround", "signbit", "fmax", "fmin", "tan", "sinh",
              "cosh", "log10", "ldexp", "atanh", "atan", "asinh", "asin", "acosh", "acos",
              "nanf", "atan2", "nextafter"],
    "condition_variable": ["condition_variable"],
    "cstdarg": ["va_list"],
    "cstddef": ["byte", "max_align_t", "nullptr_t", "ptrdiff_t", "size_t"],
    "cstdint": ["int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
                "uint64_t", "intptr_t", "uintptr_t", "uintmax_t"],
    "cstdio": ["FILE", "fclose", "fflush", "fopen", "fprintf", "fputs", "fread", "fwrite",
               "printf", "remove", "rename", "snprintf", "vsnprintf", "fseek", "ftell",
               "sscanf", "setvbuf", "perror", "fscanf"],
    "cstdlib": ["abort", "aligned_alloc", "atoi", "calloc", "atol", "atoll", "exit", "free", "getenv",
                "malloc", "realloc", "strtod", "strtol", "strtoll", "strtoull", "_Exit", "atof",
                "strtoul", "system", "atexit"],
    "cstring": ["memcmp", "memcpy", "memmove", "memset", "strchr", "strcmp", "strerror", "strlen",
                "strncmp", "strrchr", "strstr"],
    "exception": ["exception", "current_exception", "rethrow_exception", "exception_ptr",
                  "terminate"],
    "filesystem": ["filesystem"],
    "fstream": ["ifstream", "ofstream", "fstream"],
    "functional": ["function", "hash", "less", "greater", "equal_to", "reference_wrapper",
                   "ref", "cref"],
    "iostream": ["cout", "cerr", "clog", "cin"],
    "iterator": ["next", "prev", "back_inserter", "distance", "advance", "istreambuf_iterator"],
    "initializer_list": ["initializer_list"],
    "limits": ["numeric_limits"],
    "map": ["map"],
    "memory": ["make_shared", "make_unique", "shared_ptr", "unique_ptr"],
    "mutex": ["call_once", "lock_guard", "mutex", "once_flag", "try_to_lock", "unique_lock",
              "scoped_lock", "recursive_mutex"],
    "new": ["bad_alloc", "nothrow", "align_val_t"],
    "numeric": ["accumulate", "iota", "gcd", "lcm"],
    "optional": ["optional", "nullopt"],
    "random": ["mt19937", "mt19937_64", "random_device", "uniform_int_distribution",
               "uniform_real_distribution", "normal_distribution"],
    "ratio": ["milli", "micro", "nano", "ratio"],
    "regex": ["regex", "regex_replace", "regex_search", "regex_match", "smatch"],
    "set": ["set"],
    "span": ["span"],
    "sstream": ["istringstream", "ostringstream", "stringstream"],
    "stdexcept": ["invalid_argument", "logic_error", "out_of_range", "runtime_error"],
    "string": ["string", "to_string", "stoi", "stol", "stoll", "stoul", "getline"],
    "string_view": ["string_view"],
    "system_error": ["error_code", "system_error", "errc", "generic_category",
                     "system_category"],
    "thread": ["thread", "this_thread"],
    "tuple": ["apply", "make_tuple", "tie", "tuple"],
    "type_traits": ["conditional_t", "decay_t", "enable_if_t", "integral_constant",
                    "is_floating_point_v", "is_integral_v", "is_same_v", "is_signed_v",
                    "is_unsigned_v", "make_unsigned_t", "remove_cv_t", "remove_reference_t",
                    "is_trivially_copyable_v", "underlying_type_t", "is_pointer_v",
                    "remove_pointer_t"],
    "unordered_map": ["unordered_map"],
    "unordered_set": ["unordered_set"],
    "utility": ["forward", "make_pair", "move", "pair", "swap", "exchange"],
    "variant": ["variant", "visit", "get_if", "holds_alternative", "variant_size_v", "monostate"],
    "vector": ["vector"],
}
DECLARED_IN = {}
for header, names in HEADERS.items():
    for name in names:
        DECLARED_IN.setdefault(name, []).append(header)
# Headers the standard says also declare these names.
DECLARED_IN["swap"].append("algorithm")
DECLARED_IN["abs"] = ["cstdlib", "cmath"]
DECLARED_IN["size_t"] += ["cstdio", "cstdlib", "cstring"]
for name in HEADERS["ratio"]:
    DECLARED_IN[name].append("chrono")
for container in ("vector", "string", "map", "array", "set", "unordered_map", "utility"):
    DECLARED_IN["initializer_list"].append(container)
# std::size, std::begin and std::end: <iterator>, or any container header.
for name in ("size", "begin", "end", "data"):
    DECLARED_IN[name] = ["iterator", "array", "map", "set", "string", "string_view",
                         "unordered_map", "unordered_set", "vector"]
# std::erase and std::erase_if (C++20): each container's own header.
for name in ("erase", "erase_if"):
    DECLARED_IN[name] = ["vector", "string", "map", "set", "unordered_map", "unordered_set"]
# The filesystem functions report through std::error_code.
DECLARED_IN["error_code"].append("filesystem")
# std::ios (its openmode and flags), std::streamsize and the stream manipulators: <ios>, or the
# stream headers that include it.
for name in ("ios", "streamsize", "hex", "dec", "fixed", "scientific", "boolalpha"):
    DECLARED_IN[name] = ["ios", "iostream", "istream", "ostream", "fstream", "sstream"]
# std::getline of a stream: <string> declares it for strings, <istream> for character arrays.
DECLARED_IN["getline"].append("istream")

COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                               re.S)
STD_NAME = re.compile(r"(?<![\w:])std::(\w+)")
# The fixed-width integer types are also used unqualified; GCC 13's <string>, <vector> and
# others no longer bring <cstdint> in, which is the commonest break its porting notes list.
FIXED_WIDTH = re.compile(r"(?<![\w:])(u?int(?:8|16|32|64)_t|u?intptr_t)\b")
FIXED_WIDTH_HEADERS = ["cstdint", "stdint.h"]
INCLUDE = re.compile(r"^\s*#\s*include\s*<([\w./]+)>", re.M)


def files_of(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in sorted(os.walk(path)):
                for name in sorted(names):
                    if name.endswith((".h", ".cpp")):
                        yield os.path.join(root, name)
        else:
            yield path


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    problems = 0
    for path in files_of(sys.argv[1:]):
        text = open(path, encoding="utf-8").read()
        included = set(INCLUDE.findall(text))
        code = COMMENT_OR_STRING.sub(" ", text)
        fixed_width = FIXED_WIDTH.search(code)
        if fixed_width and not included.intersection(FIXED_WIDTH_HEADERS):
            print(f"{path}: {fixed_width.group(1)} without #include <cstdint>")
            problems += 1
        for name in sorted(set(STD_NAME.findall(code))):
            headers = DECLARED_IN.get(name)
            if headers is None:
                print(f"{path}: std::{name} is not in std_includes.py's table; add it")
                problems += 1
            elif not included.intersection(headers):
                print(f"{path}: std::{name} without #include <{headers[0]}>")
                problems += 1
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
