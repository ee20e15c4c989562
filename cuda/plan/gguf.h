// gguf.h — a small mmap-based GGUF reader (host only, no CUDA). Every offset and size read from
// the file is bounds-checked; errors are statuses with a message naming the file and the fault.
// Format (GGUF v2/v3): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv pairs
// (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 type,
// u64 offset), padding to general.alignment (default 32), then the tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "prefill.h"

namespace pf {

enum class GgufType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
    ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

struct GgufValue {
    GgufType type = GgufType::U8;
    GgufType elem_type = GgufType::U8;  // for arrays
    uint64_t count = 0;                 // for arrays
    double num = 0;                     // numeric scalars (and bool)
    int64_t inum = 0;                   // integer scalars, exact
    std::string str;                    // strings
    std::vector<int64_t> ints;          // integer/bool arrays (kept; string arrays are skipped)
};

struct GgufTensor {
    std::string name;
    uint32_t type = 0;                  // GGML type id
    std::vector<int64_t> ne;            // GGUF order: ne[0] contiguous
    uint64_t offset = 0;                // relative to the data section
    size_t bytes = 0;
    const uint8_t *data = nullptr;      // inside the mapping
};

class GgufFile {
  public:
    GgufFile() = default;
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    // Maps and parses `path`. IO_ERROR for a file that cannot be read (missing, no permission,
    // not a regular file: refused before it is opened, so a FIFO never blocks); FORMAT_ERROR for
    // one that is not a GGUF, is truncated or malformed; UNSUPPORTED for a tensor type this build
    // does not know.
    pf_status open(const char *path);
    // Parses `size` bytes at `data` (not copied: they must outlive this object); `name` stands
    // for the path in messages. The same checks and errors as open().
    pf_status open_memory(const void *data, size_t size, const char *name);

    const std::string &path() const { return path_; }
    const GgufValue *find(const std::string &key) const;
    const GgufTensor *tensor(const std::string &name) const;
    const std::vector<GgufTensor> &tensors() const { return tensors_; }
    size_t file_bytes() const { return size_; }

    // Typed metadata getters: FORMAT_ERROR naming the key when absent (required) or of a wrong type.
    pf_status get_u32(const std::string &key, int64_t *out, bool required = true) const;
    pf_status get_f32(const std::string &key, double *out, bool required = true) const;
    pf_status get_str(const std::string &key, std::string *out, bool required = true) const;

  private:
    pf_status parse(const uint8_t *base);  // the bytes [base, base + size_)

    std::string path_;
    void *map_ = nullptr;
    size_t size_ = 0;
    std::map<std::string, GgufValue> kv_;
    std::vector<GgufTensor> tensors_;
    std::map<std::string, size_t> index_;
};

}  // namespace pf
