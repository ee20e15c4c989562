// gguf.cpp — see gguf.h. Parsing never reads past the mapping: every read goes through Cursor,
// which checks the remaining length first.
#include "plan/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "plan/qtype.h"

namespace pf {
namespace {

constexpr uint64_t kMaxDims = 4;
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;  // no key or name is a GiB long

class Cursor {
  public:
    Cursor(const uint8_t *base, size_t size, const std::string &path)
        : base_(base), size_(size), path_(path) {}
    size_t pos() const { return pos_; }

    pf_status bytes(void *dst, size_t n, const char *what) {
        if (n > size_ - pos_)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: truncated GGUF (reading %s at byte %zu of %zu)",
                        path_.c_str(), what, pos_, size_);
        if (dst) std::memcpy(dst, base_ + pos_, n);
        pos_ += n;
        return PF_STATUS_OK;
    }
    template <class T>
    pf_status get(T *v, const char *what) { return bytes(v, sizeof(T), what); }
    pf_status str(std::string *s, const char *what) {
        uint64_t n = 0;
        PF_TRY(get(&n, what));
        if (n > kMaxStringBytes || n > size_ - pos_)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: %s has length %llu at byte %zu",
                        path_.c_str(), what, (unsigned long long)n, pos_);
        if (s) s->assign(reinterpret_cast<const char *>(base_ + pos_), size_t(n));
        pos_ += size_t(n);
        return PF_STATUS_OK;
    }

  private:
    const uint8_t *base_;
    size_t size_;
    size_t pos_ = 0;
    const std::string &path_;
};

size_t scalar_size(GgufType t) {
    switch (t) {
        case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
        case GgufType::U16: case GgufType::I16: return 2;
        case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
        case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
        default: return 0;
    }
}

// A float's integer value (inum of a float key), saturated: the cast of a NaN or of a value
// outside int64's range is undefined behaviour (found by fuzz_gguf).
int64_t saturate_to_int64(double x) {
    constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, exact in a double
    if (std::isnan(x)) return 0;
    if (x >= kTwo63) return INT64_MAX;
    if (x < -kTwo63) return INT64_MIN;
    return int64_t(x);
}

// What a path that is not a regular file is, for the message that refuses it.
const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

// The first bytes of a file as C-escaped text ("GGML", "\x7fELF"), for the message that refuses it.
std::string shown_bytes(const uint8_t *p, size_t n) {
    std::string out;
    char buf[8];
    for (size_t i = 0; i < n; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\') {
            out += char(p[i]);
        } else {
            std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
            out += buf;
        }
    }
    return out;
}

// Reads one scalar of type t into v (num and inum).
pf_status read_scalar(Cursor &c, GgufType t, GgufValue *v, const std::string &key) {
    uint8_t raw[8] = {0};
    PF_TRY(c.bytes(raw, scalar_size(t), key.c_str()));
    switch (t) {
        case GgufType::U8: v->inum = raw[0]; break;
        case GgufType::I8: v->inum = int8_t(raw[0]); break;
        case GgufType::BOOL: v->inum = raw[0] != 0; break;
        case GgufType::U16: { uint16_t x; std::memcpy(&x, raw, 2); v->inum = x; break; }
        case GgufType::I16: { int16_t x; std::memcpy(&x, raw, 2); v->inum = x; break; }
        case GgufType::U32: { uint32_t x; std::memcpy(&x, raw, 4); v->inum = x; break; }
        case GgufType::I32: { int32_t x; std::memcpy(&x, raw, 4); v->inum = x; break; }
        case GgufType::U64: { uint64_t x; std::memcpy(&x, raw, 8); v->inum = int64_t(x); break; }
        case GgufType::I64: { int64_t x; std::memcpy(&x, raw, 8); v->inum = x; break; }
        case GgufType::F32: { float x; std::memcpy(&x, raw, 4); v->num = x; v->inum = saturate_to_int64(x); return PF_STATUS_OK; }
        case GgufType::F64: { double x; std::memcpy(&x, raw, 8); v->num = x; v->inum = saturate_to_int64(x); return PF_STATUS_OK; }
        default: return PF_STATUS_INTERNAL;
    }
    v->num = double(v->inum);
    return PF_STATUS_OK;
}

}  // namespace

GgufFile::~GgufFile() {
    if (map_) munmap(map_, size_);
}

pf_status GgufFile::open(const char *path) {
    path_ = path;
    // A FIFO, a device or a directory is refused before it is opened: open() on a FIFO blocks
    // until a writer comes (`pyprefill info` hung on one), and a device may act on an open.
    struct stat st;
    if (stat(path, &st) != 0)
        return fail(PF_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(PF_STATUS_IO_ERROR, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    // O_NONBLOCK: should the path become a FIFO between the stat and here, the open returns at
    // once and the fstat below refuses it (on a regular file the flag changes nothing).
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(PF_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(PF_STATUS_IO_ERROR, "%s: not a regular file", path);
    }
    size_ = size_t(st.st_size);
    if (size_ == 0) {  // mmap refuses a length of 0; parse() words the fault
        ::close(fd);
        static const uint8_t kNothing = 0;
        return parse(&kNothing);
    }
    map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        return fail(PF_STATUS_IO_ERROR, "%s: mmap failed: %s", path, strerror(errno));
    }
    return parse(static_cast<const uint8_t *>(map_));
}

pf_status GgufFile::open_memory(const void *data, size_t size, const char *name) {
    path_ = name;
    size_ = size;
    static const uint8_t kNothing = 0;
    return parse(size ? static_cast<const uint8_t *>(data) : &kNothing);
}

pf_status GgufFile::parse(const uint8_t *base) {
    const char *path = path_.c_str();
    // The magic first: a short text file is "not a GGUF", not a "truncated" one.
    const size_t shown = size_ < 4 ? size_ : 4;
    if (size_ == 0)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: empty file (0 bytes): not a GGUF file", path);
    if (std::memcmp(base, "GGUF", shown) != 0)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: not a GGUF file (bad magic \"%s\", expected \"GGUF\")",
                    path, shown_bytes(base, shown).c_str());
    if (size_ < 24)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: truncated GGUF (%zu bytes, the header alone is 24)",
                    path, size_);
    Cursor c(base, size_, path_);
    PF_TRY(c.bytes(nullptr, 4, "magic"));
    uint32_t version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    PF_TRY(c.get(&version, "version"));
    if (version != 2 && version != 3)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: GGUF version %u is not supported (2 or 3)", path, version);
    PF_TRY(c.get(&n_tensors, "tensor_count"));
    PF_TRY(c.get(&n_kv, "kv_count"));
    // Each kv pair and tensor info takes at least 12 bytes: a cheap sanity bound on the counts.
    if (n_tensors > size_ / 12 || n_kv > size_ / 12)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: %llu tensors, %llu keys in %zu bytes",
                    path, (unsigned long long)n_tensors, (unsigned long long)n_kv, size_);
    for (uint64_t i = 0; i < n_kv; i++) {
        std::string key;
        const size_t at = c.pos();
        PF_TRY(c.str(&key, "metadata key"));
        if (key.empty())  // e.g. a key count larger than the keys written: padding read as a key
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: metadata key %llu of %llu (at byte "
                        "%zu) has an empty name; is kv_count too large?", path, (unsigned long long)i,
                        (unsigned long long)n_kv, at);
        uint32_t t = 0;
        PF_TRY(c.get(&t, key.c_str()));
        GgufValue v;
        v.type = GgufType(t);
        if (v.type == GgufType::STRING) {
            PF_TRY(c.str(&v.str, key.c_str()));
        } else if (v.type == GgufType::ARRAY) {
            uint32_t et = 0;
            PF_TRY(c.get(&et, key.c_str()));
            PF_TRY(c.get(&v.count, key.c_str()));
            v.elem_type = GgufType(et);
            if (v.elem_type == GgufType::STRING) {
                for (uint64_t j = 0; j < v.count; j++) PF_TRY(c.str(nullptr, key.c_str()));
            } else {
                const size_t es = scalar_size(v.elem_type);
                if (es == 0)
                    return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: key %s has array type %u",
                                path, key.c_str(), et);
                if (v.count > (size_ - c.pos()) / es)
                    return fail(PF_STATUS_FORMAT_ERROR, "%s: truncated GGUF (array %s)", path, key.c_str());
                const bool keep = v.count <= 4096;  // small int arrays (sections, layer flags)
                for (uint64_t j = 0; j < v.count; j++) {
                    GgufValue e;
                    PF_TRY(read_scalar(c, v.elem_type, &e, key));
                    if (keep) v.ints.push_back(e.inum);
                }
            }
        } else {
            if (scalar_size(v.type) == 0)
                return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: key %s has type %u", path,
                            key.c_str(), t);
            PF_TRY(read_scalar(c, v.type, &v, key));
        }
        kv_[key] = std::move(v);
    }
    tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; i++) {
        GgufTensor ti;
        const size_t at = c.pos();
        // A tensor_count larger than the infos written reads the padding or the data as an info:
        // the message names the info's index and the count (fail() copes with its own text).
        if (const pf_status s = c.str(&ti.name, "tensor name"); s != PF_STATUS_OK)
            return fail(s, "%s (tensor info %llu of tensor_count %llu, at byte %zu)", pf_last_error(),
                        (unsigned long long)i, (unsigned long long)n_tensors, at);
        if (ti.name.empty())  // a tensor count larger than the infos written: padding read as one
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor info %llu of %llu (at byte "
                        "%zu) has an empty name; is tensor_count too large?", path,
                        (unsigned long long)i, (unsigned long long)n_tensors, at);
        uint32_t nd = 0;
        PF_TRY(c.get(&nd, ti.name.c_str()));
        if (nd == 0 || nd > kMaxDims)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor %s has %u dims", path,
                        ti.name.c_str(), nd);
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = 0;
            PF_TRY(c.get(&ne, ti.name.c_str()));
            if (ne == 0 || ne > (uint64_t(1) << 40))
                return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor %s has ne[%u]=%llu", path,
                            ti.name.c_str(), d, (unsigned long long)ne);
            ti.ne.push_back(int64_t(ne));
        }
        PF_TRY(c.get(&ti.type, ti.name.c_str()));
        PF_TRY(c.get(&ti.offset, ti.name.c_str()));
        int64_t rows = 1;  // each ne <= 2^40, but their product can pass 2^63 (found by fuzz_gguf)
        for (size_t d = 1; d < ti.ne.size(); d++) {
            if (rows > INT64_MAX / ti.ne[d] || rows * ti.ne[d] > INT64_MAX / ti.ne[0])
                return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor %s has more than 2^63 elements",
                            path, ti.name.c_str());
            rows *= ti.ne[d];
        }
        const pf_status s = matrix_bytes(int32_t(ti.type), rows, ti.ne[0], &ti.bytes, ti.name.c_str());
        if (s == PF_STATUS_UNSUPPORTED)
            return fail(PF_STATUS_UNSUPPORTED, "%s: tensor %s has GGML type %u, which is not supported "
                        "(supported: F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS)",
                        path, ti.name.c_str(), ti.type);
        if (s != PF_STATUS_OK)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed tensor %s: %s", path, ti.name.c_str(),
                        pf_last_error());
        if (index_.count(ti.name))
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor %s appears twice", path,
                        ti.name.c_str());
        index_[ti.name] = tensors_.size();
        tensors_.push_back(std::move(ti));
    }
    int64_t alignment = 32;
    if (const GgufValue *a = find("general.alignment")) alignment = a->inum;
    if (alignment <= 0 || (alignment & (alignment - 1)))
        return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: general.alignment=%lld", path,
                    (long long)alignment);
    const size_t data_start = (c.pos() + size_t(alignment) - 1) / size_t(alignment) * size_t(alignment);
    for (GgufTensor &t : tensors_) {
        if (t.offset % uint64_t(alignment))
            return fail(PF_STATUS_FORMAT_ERROR, "%s: malformed GGUF: tensor %s offset %llu is not aligned",
                        path, t.name.c_str(), (unsigned long long)t.offset);
        if (data_start > size_ || t.offset > size_ - data_start || t.bytes > size_ - data_start - t.offset)
            return fail(PF_STATUS_FORMAT_ERROR,
                        "%s: truncated GGUF: tensor %s needs bytes [%zu, %zu) of a %zu-byte file", path,
                        t.name.c_str(), size_t(data_start + t.offset),
                        size_t(data_start + t.offset + t.bytes), size_);
        t.data = base + data_start + t.offset;
    }
    return PF_STATUS_OK;
}

const GgufValue *GgufFile::find(const std::string &key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor *GgufFile::tensor(const std::string &name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

pf_status GgufFile::get_u32(const std::string &key, int64_t *out, bool required) const {
    const GgufValue *v = find(key);
    if (!v) {
        if (!required) return PF_STATUS_OK;
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is missing", path_.c_str(), key.c_str());
    }
    if (v->type == GgufType::STRING || v->type == GgufType::ARRAY || v->type == GgufType::F32 ||
        v->type == GgufType::F64)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is not an integer", path_.c_str(), key.c_str());
    *out = v->inum;
    return PF_STATUS_OK;
}

pf_status GgufFile::get_f32(const std::string &key, double *out, bool required) const {
    const GgufValue *v = find(key);
    if (!v) {
        if (!required) return PF_STATUS_OK;
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is missing", path_.c_str(), key.c_str());
    }
    if (v->type == GgufType::STRING || v->type == GgufType::ARRAY)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is not a number", path_.c_str(), key.c_str());
    *out = v->num;
    return PF_STATUS_OK;
}

pf_status GgufFile::get_str(const std::string &key, std::string *out, bool required) const {
    const GgufValue *v = find(key);
    if (!v) {
        if (!required) return PF_STATUS_OK;
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is missing", path_.c_str(), key.c_str());
    }
    if (v->type != GgufType::STRING)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: metadata key %s is not a string", path_.c_str(), key.c_str());
    *out = v->str;
    return PF_STATUS_OK;
}

}  // namespace pf
