#pragma once
/// File helpers: whole-file reads, atomic writes (temporary name, then rename, so a reader never
/// sees a half-written file), advisory locks across processes.

#include <filesystem>
#include <string>
#include <string_view>

namespace kiln::files {

/// Reads a whole file; throws UserError naming the path when it cannot be read.
std::string read(const std::filesystem::path& path);

/// A whole file mapped read-only (mmap): its bytes are read from the page cache as they are
/// touched, never copied into the process. Throws UserError naming the path when the file cannot
/// be opened or mapped; an empty file gives empty bytes.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

/// Writes `data` to `path` through a temporary file in the same directory and a rename; creates
/// parent directories. Throws UserError naming the path on failure, leaving no partial file.
void write_atomic(const std::filesystem::path& path, std::string_view data);

/// An exclusive advisory lock (flock) on a lock file, held for the object's lifetime. Safe
/// between processes; the lock file itself is left in place.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& lock_path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kiln::files
