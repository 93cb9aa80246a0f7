// Image decode/encode with libjpeg(-turbo) and libpng.
//
// Both libraries report errors through callbacks that must not return; they longjmp back to the
// function that armed setjmp. Every function here that calls setjmp keeps only trivially
// destructible locals (state lives in a session object owned by the caller), so a jump never
// skips a destructor. Tensors are allocated between two setjmp phases, in ordinary C++ code.
#include "io/image.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "core/strings.hpp"

namespace libreyolo::io {
namespace {

// Larger images are hostile headers or mistakes; refusing them before allocating keeps a bad
// file from taking the process down. 2^28 pixels is a 16384 x 16384 image (768 MiB as RGB8).
constexpr int64_t kMaxPixels = int64_t(1) << 28;
constexpr int64_t kMaxSide = 65535;

void check_dimensions(int64_t width, int64_t height, const std::string& name) {
  if (width <= 0 || height <= 0)
    throw DataError(strfmt("image '%s' has invalid size %lldx%lld", name.c_str(),
                           (long long)width, (long long)height));
  if (width > kMaxSide || height > kMaxSide || width * height > kMaxPixels)
    throw DataError(strfmt("image '%s' is too large (%lldx%lld; the limit is %lld pixels, "
                           "%lld per side)",
                           name.c_str(), (long long)width, (long long)height,
                           (long long)kMaxPixels, (long long)kMaxSide));
}

enum class Format { Jpeg, Png, Bmp, Other };

Format sniff(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return Format::Jpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return Format::Png;
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return Format::Bmp;
  return Format::Other;
}

// Names the formats a dataset scan accepts but this reader does not decode, for the message.
std::string describe_unsupported(const uint8_t* d, size_t n) {
  if (n >= 4 && std::memcmp(d, "GIF8", 4) == 0) return "GIF";
  if (n >= 4 && (std::memcmp(d, "II*\0", 4) == 0 || std::memcmp(d, "MM\0*", 4) == 0))
    return "TIFF";
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0)
    return "WebP";
  if (n >= 3 && d[0] == 'P' && (d[1] == 'F' || d[1] == 'f') && (d[2] == '\n' || d[2] == '\r'))
    return "PFM";
  if (n == 0) return "empty file";
  return "unknown format";
}

void read_file_into(const std::string& path, std::vector<uint8_t>& buf) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      throw DataError(strfmt("image not found: '%s'", path.c_str()), "", "data_not_found");
    throw DataError(strfmt("cannot open image '%s': %s", path.c_str(), std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(strfmt("cannot read image '%s': not a regular file", path.c_str()));
  }
  buf.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      throw DataError(strfmt("cannot read image '%s': %s", path.c_str(),
                             r == 0 ? "file shrank while reading" : std::strerror(err)));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> buf;
  read_file_into(path, buf);
  return buf;
}

// A new tensor, or a view of `scratch` when given.
torch::Tensor new_rgb(int64_t height, int64_t width, DecodeScratch* scratch) {
  if (scratch)
    return torch::from_blob(scratch->pixels(static_cast<size_t>(height * width * 3)), {height, width, 3},
                            torch::TensorOptions().dtype(torch::kUInt8));
  return torch::empty({height, width, 3}, torch::TensorOptions().dtype(torch::kUInt8));
}

// ------------------------------------------------------------------------------------ JPEG

struct JpegError {
  jpeg_error_mgr mgr;  // first member: libjpeg hands back a pointer to it
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// A truncated file would decode with its missing part grey; we refuse it instead (see
// image.hpp). Other warnings (extraneous bytes before a marker, ...) leave a complete image and
// are common in real datasets, so they are ignored silently.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(err->message, sizeof err->message, "file is truncated");
    std::longjmp(err->jump, 1);
  }
}

struct JpegDecodeSession {
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  bool created = false;
  JpegDecodeSession() {
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_on_error;
    err.mgr.emit_message = jpeg_on_message;
  }
  ~JpegDecodeSession() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  JpegDecodeSession(const JpegDecodeSession&) = delete;
  JpegDecodeSession& operator=(const JpegDecodeSession&) = delete;
};

// Reads from `file` when given (it reads only as far as the header), else from memory.
// target_longest > 0 asks for libjpeg's DCT scaling: the smallest of 1/8, 1/4, 1/2 (else full
// size) whose longest side is still >= target_longest. Only these scales have SIMD inverse DCTs
// in libjpeg-turbo; the others are slower than a full decode (an 810x1080 photo: 1.8, 2.0, 2.2 ms
// at 1/8, 2/8, 4/8; 2.6, 3.8, 4.4, 6.3 ms at 3/8, 5/8, 6/8, 7/8; 2.8 ms at full size).
bool jpeg_header_phase(JpegDecodeSession& s, const uint8_t* data, size_t size, FILE* file,
                       int target_longest) {
  if (setjmp(s.err.jump)) return false;
  jpeg_create_decompress(&s.cinfo);
  s.created = true;
  if (file)
    jpeg_stdio_src(&s.cinfo, file);
  else
    jpeg_mem_src(&s.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s.cinfo, TRUE);
  // libjpeg's accurate defaults stay (JDCT_ISLOW, fancy upsampling): JDCT_IFAST and/or plain
  // upsampling saved only 3-9% of the decode time of an 810x1080 photo.
  // Everything libjpeg can produce RGB from; CMYK/YCCK come out as CMYK and are converted here.
  const bool cmyk = s.cinfo.jpeg_color_space == JCS_CMYK || s.cinfo.jpeg_color_space == JCS_YCCK;
  s.cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  s.cinfo.scale_num = 8;
  s.cinfo.scale_denom = 8;
  if (target_longest > 0) {
    const unsigned longest = std::max(s.cinfo.image_width, s.cinfo.image_height);
    for (unsigned n = 1; n < 8; n *= 2) {
      // libjpeg rounds scaled sizes up: ceil(longest * n / 8).
      if ((longest * n + 7) / 8 >= static_cast<unsigned>(target_longest)) {
        s.cinfo.scale_num = n;
        break;
      }
    }
  }
  jpeg_calc_output_dimensions(&s.cinfo);
  return true;
}

// Writes RGB rows straight into `dst`; CMYK goes through `cmyk_row` (4 * width bytes).
bool jpeg_pixels_phase(JpegDecodeSession& s, uint8_t* dst, uint8_t* cmyk_row) {
  if (setjmp(s.err.jump)) return false;
  jpeg_start_decompress(&s.cinfo);
  const size_t stride = size_t(s.cinfo.output_width) * 3;
  if (!cmyk_row) {
    JSAMPROW rows[16];
    while (s.cinfo.output_scanline < s.cinfo.output_height) {
      const JDIMENSION left = s.cinfo.output_height - s.cinfo.output_scanline;
      const JDIMENSION n = std::min<JDIMENSION>(left, 16);
      for (JDIMENSION i = 0; i < n; ++i)
        rows[i] = dst + size_t(s.cinfo.output_scanline + i) * stride;
      jpeg_read_scanlines(&s.cinfo, rows, n);
    }
  } else {
    // Adobe writes CMYK inverted (0 = full ink) and marks it with its APP14 segment; plain CMYK
    // stores ink amounts. Either way RGB = (1 - C)(1 - K) in [0, 1].
    const bool inverted = s.cinfo.saw_Adobe_marker;
    while (s.cinfo.output_scanline < s.cinfo.output_height) {
      uint8_t* out = dst + size_t(s.cinfo.output_scanline) * stride;
      JSAMPROW row = cmyk_row;
      jpeg_read_scanlines(&s.cinfo, &row, 1);
      for (JDIMENSION x = 0; x < s.cinfo.output_width; ++x) {
        const uint8_t* p = cmyk_row + 4 * size_t(x);
        const unsigned k = inverted ? p[3] : 255u - p[3];
        for (int c = 0; c < 3; ++c) {
          const unsigned v = inverted ? p[c] : 255u - p[c];
          out[3 * x + c] = static_cast<uint8_t>((v * k + 127) / 255);
        }
      }
    }
  }
  jpeg_finish_decompress(&s.cinfo);
  return true;
}

torch::Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& name,
                          int target_longest, DecodeScratch* scratch) {
  JpegDecodeSession s;
  if (!jpeg_header_phase(s, data, size, nullptr, target_longest))
    throw DataError(strfmt("cannot decode JPEG '%s': %s", name.c_str(), s.err.message));
  check_dimensions(s.cinfo.image_width, s.cinfo.image_height, name);
  torch::Tensor out = new_rgb(s.cinfo.output_height, s.cinfo.output_width, scratch);
  std::vector<uint8_t> cmyk_row;
  if (s.cinfo.out_color_space == JCS_CMYK) cmyk_row.resize(size_t(s.cinfo.output_width) * 4);
  if (!jpeg_pixels_phase(s, out.data_ptr<uint8_t>(), cmyk_row.empty() ? nullptr : cmyk_row.data()))
    throw DataError(strfmt("cannot decode JPEG '%s': %s", name.c_str(), s.err.message));
  return out;
}

// ------------------------------------------------------------------------------------- PNG

struct PngDecodeSession {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[256] = {0};
  ~PngDecodeSession() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

[[noreturn]] void png_on_error(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngDecodeSession*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", msg);
  png_longjmp(png, 1);
}

// Ancillary-chunk complaints (e.g. "iCCP: known incorrect sRGB profile") do not affect the
// pixels and are common; one line per image would flood the log.
void png_on_warning(png_structp, png_const_charp) {}

void png_read_from_memory(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngDecodeSession*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) png_error(png, "file is truncated");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

bool png_header_phase(PngDecodeSession& s) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_set_read_fn(s.png, &s, png_read_from_memory);
  png_set_user_limits(s.png, kMaxSide, kMaxSide);
  png_read_info(s.png, s.info);
  const int color = png_get_color_type(s.png, s.info);
  const int depth = png_get_bit_depth(s.png, s.info);
  // Everything becomes 8-bit RGB: palettes expanded, 16-bit keeps its high byte, grey is
  // replicated, alpha (and tRNS transparency, never expanded) is dropped.
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s.png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(s.png);
  if (depth == 16) png_set_strip_16(s.png);
  // Palette expansion also turns tRNS into alpha, so strip whenever either is present.
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(s.png, s.info, PNG_INFO_tRNS))
    png_set_strip_alpha(s.png);
  if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(s.png);
  png_set_interlace_handling(s.png);
  png_read_update_info(s.png, s.info);
  return true;
}

bool png_pixels_phase(PngDecodeSession& s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  // The trailing chunks after the pixel data are not read: a file whose pixels are complete
  // decodes even when its end is damaged.
  png_read_image(s.png, rows);
  return true;
}

torch::Tensor decode_png(const uint8_t* data, size_t size, const std::string& name, DecodeScratch* scratch) {
  PngDecodeSession s;
  s.data = data;
  s.size = size;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error, png_on_warning);
  if (s.png) s.info = png_create_info_struct(s.png);
  if (!s.png || !s.info)
    throw RuntimeError(strfmt("cannot decode PNG '%s': out of memory", name.c_str()));
  if (!png_header_phase(s))
    throw DataError(strfmt("cannot decode PNG '%s': %s", name.c_str(), s.message));
  const png_uint_32 width = png_get_image_width(s.png, s.info);
  const png_uint_32 height = png_get_image_height(s.png, s.info);
  check_dimensions(width, height, name);
  if (png_get_channels(s.png, s.info) != 3 || png_get_rowbytes(s.png, s.info) != size_t(width) * 3)
    throw DataError(strfmt("cannot decode PNG '%s': unsupported pixel layout", name.c_str()));
  torch::Tensor out = new_rgb(height, width, scratch);
  std::vector<png_bytep> rows(height);
  uint8_t* base = out.data_ptr<uint8_t>();
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = base + size_t(y) * width * 3;
  if (!png_pixels_phase(s, rows.data()))
    throw DataError(strfmt("cannot decode PNG '%s': %s", name.c_str(), s.message));
  return out;
}

// ------------------------------------------------------------------------------------- BMP
// Uncompressed Windows bitmaps (24/32-bit and 1/4/8-bit palettes), which dataset scans accept.

uint32_t le32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24; }
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

struct BmpHeader {
  int64_t width = 0, height = 0;  // height > 0: rows stored bottom-up
  bool bottom_up = true;
  int bits = 0;
  uint32_t pixel_offset = 0;
  uint32_t palette_offset = 0;
  uint32_t palette_size = 0;
};

BmpHeader parse_bmp(const uint8_t* d, size_t n, const std::string& name) {
  auto fail = [&](const char* why) {
    return DataError(strfmt("cannot decode BMP '%s': %s", name.c_str(), why));
  };
  if (n < 26) throw fail("file is truncated");
  BmpHeader h;
  h.pixel_offset = le32(d + 10);
  const uint32_t info_size = le32(d + 14);
  if (info_size < 40) throw fail("only BITMAPINFOHEADER (or newer) bitmaps are supported");
  if (n < 14 + size_t(info_size)) throw fail("file is truncated");
  h.width = static_cast<int32_t>(le32(d + 18));
  const int32_t raw_height = static_cast<int32_t>(le32(d + 22));
  h.bottom_up = raw_height > 0;
  h.height = raw_height > 0 ? int64_t(raw_height) : -int64_t(raw_height);
  h.bits = le16(d + 28);
  const uint32_t compression = le32(d + 30);
  // BI_BITFIELDS with 32 bits is only accepted with the usual BGRA masks (checked below).
  if (compression != 0 && !(compression == 3 && h.bits == 32))
    throw fail("compressed bitmaps are not supported");
  if (compression == 3) {
    const size_t masks = 14 + 40;  // after a 40-byte header, or inside a longer one
    if (n < masks + 12) throw fail("file is truncated");
    if (le32(d + masks) != 0xFF0000 || le32(d + masks + 4) != 0xFF00 || le32(d + masks + 8) != 0xFF)
      throw fail("unusual bit-field masks are not supported");
  }
  if (h.bits != 1 && h.bits != 4 && h.bits != 8 && h.bits != 24 && h.bits != 32)
    throw fail("unsupported bit depth");
  if (h.bits <= 8) {
    uint32_t colors = le32(d + 46);
    if (colors == 0 || colors > (1u << h.bits)) colors = 1u << h.bits;
    h.palette_offset = 14 + info_size;
    h.palette_size = colors;
    if (size_t(h.palette_offset) + size_t(colors) * 4 > n) throw fail("file is truncated");
  }
  check_dimensions(h.width, h.height, name);
  const size_t row_bytes = ((size_t(h.width) * h.bits + 31) / 32) * 4;
  if (h.pixel_offset > n || (n - h.pixel_offset) / row_bytes < size_t(h.height))
    throw fail("file is truncated");
  return h;
}

torch::Tensor decode_bmp(const uint8_t* d, size_t n, const std::string& name, DecodeScratch* scratch) {
  const BmpHeader h = parse_bmp(d, n, name);
  torch::Tensor out = new_rgb(h.height, h.width, scratch);
  uint8_t* base = out.data_ptr<uint8_t>();
  const size_t row_bytes = ((size_t(h.width) * h.bits + 31) / 32) * 4;
  const uint8_t* palette = d + h.palette_offset;
  for (int64_t y = 0; y < h.height; ++y) {
    const uint8_t* src = d + h.pixel_offset + size_t(h.bottom_up ? h.height - 1 - y : y) * row_bytes;
    uint8_t* dst = base + size_t(y) * size_t(h.width) * 3;
    if (h.bits >= 24) {
      const int step = h.bits / 8;
      for (int64_t x = 0; x < h.width; ++x, src += step, dst += 3) {
        dst[0] = src[2];
        dst[1] = src[1];
        dst[2] = src[0];
      }
    } else {
      const int per_byte = 8 / h.bits;
      const unsigned mask = (1u << h.bits) - 1;
      for (int64_t x = 0; x < h.width; ++x, dst += 3) {
        const int shift = 8 - h.bits * (1 + int(x % per_byte));
        unsigned idx = (src[x / per_byte] >> shift) & mask;
        if (idx >= h.palette_size) idx = 0;  // out-of-range index in a damaged file
        dst[0] = palette[4 * idx + 2];
        dst[1] = palette[4 * idx + 1];
        dst[2] = palette[4 * idx + 0];
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------- encoding

void check_encodable(const torch::Tensor& img, const char* what) {
  if (!img.defined() || img.dim() != 3 || img.scalar_type() != torch::kUInt8 ||
      (img.size(2) != 3 && img.size(2) != 1) || !img.device().is_cpu())
    throw UsageError(strfmt("%s: expected a CPU uint8 tensor [H, W, 3] or [H, W, 1]", what));
  if (img.size(0) <= 0 || img.size(1) <= 0 || img.size(0) > kMaxSide || img.size(1) > kMaxSide)
    throw UsageError(strfmt("%s: image size %lldx%lld is out of range", what,
                            (long long)img.size(1), (long long)img.size(0)));
}

struct JpegEncodeSession {
  jpeg_compress_struct cinfo{};
  JpegError err{};
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  bool created = false;
  JpegEncodeSession() {
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_on_error;
    err.mgr.emit_message = [](j_common_ptr, int) {};
  }
  ~JpegEncodeSession() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buffer);  // allocated by jpeg_mem_dest
  }
  JpegEncodeSession(const JpegEncodeSession&) = delete;
  JpegEncodeSession& operator=(const JpegEncodeSession&) = delete;
};

bool jpeg_encode_phase(JpegEncodeSession& s, const uint8_t* pixels, int height, int width,
                       int channels, int quality) {
  if (setjmp(s.err.jump)) return false;
  jpeg_create_compress(&s.cinfo);
  s.created = true;
  jpeg_mem_dest(&s.cinfo, &s.buffer, &s.size);
  s.cinfo.image_width = static_cast<JDIMENSION>(width);
  s.cinfo.image_height = static_cast<JDIMENSION>(height);
  s.cinfo.input_components = channels;
  s.cinfo.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&s.cinfo);
  jpeg_set_quality(&s.cinfo, quality, TRUE);
  jpeg_start_compress(&s.cinfo, TRUE);
  const size_t stride = size_t(width) * channels;
  while (s.cinfo.next_scanline < s.cinfo.image_height) {
    // libjpeg takes non-const rows but only reads them.
    JSAMPROW row = const_cast<uint8_t*>(pixels + size_t(s.cinfo.next_scanline) * stride);
    jpeg_write_scanlines(&s.cinfo, &row, 1);
  }
  jpeg_finish_compress(&s.cinfo);
  return true;
}

struct PngEncodeSession {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::string out;
  char message[256] = {0};
  ~PngEncodeSession() {
    if (png) png_destroy_write_struct(&png, info ? &info : nullptr);
  }
};

[[noreturn]] void png_on_write_error(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngEncodeSession*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_write_to_string(png_structp png, png_bytep data, size_t n) {
  auto* s = static_cast<PngEncodeSession*>(png_get_io_ptr(png));
  try {
    s->out.append(reinterpret_cast<const char*>(data), n);
  } catch (const std::exception&) {
    png_error(png, "out of memory");
  }
}

bool png_encode_phase(PngEncodeSession& s, png_bytepp rows, int height, int width, int channels) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_set_write_fn(s.png, &s, png_write_to_string, nullptr);
  png_set_IHDR(s.png, s.info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(s.png, s.info);
  png_write_image(s.png, rows);
  png_write_end(s.png, nullptr);
  return true;
}

std::string lower_extension(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  return lower(path.substr(dot + 1));
}

torch::Tensor decode_any(const uint8_t* data, size_t size, const std::string& name,
                         int target_longest, DecodeScratch* scratch = nullptr) {
  switch (sniff(data, size)) {
    case Format::Jpeg:
      return decode_jpeg(data, size, name, target_longest, scratch);
    case Format::Png:
      return decode_png(data, size, name, scratch);
    case Format::Bmp:
      return decode_bmp(data, size, name, scratch);
    case Format::Other:
      break;
  }
  throw DataError(strfmt("cannot decode image '%s': %s (LibreYOLO C++ reads JPEG, PNG and BMP)",
                         name.c_str(), describe_unsupported(data, size).c_str()));
}

}  // namespace

torch::Tensor decode_image_bytes(const uint8_t* data, size_t size, const std::string& name) {
  return decode_any(data, size, name, 0);
}

torch::Tensor decode_image(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path);
  return decode_any(bytes.data(), bytes.size(), path, 0);
}

torch::Tensor decode_image_for_size(const std::string& path, int target_longest_side) {
  if (target_longest_side <= 0)
    throw UsageError(strfmt("decode_image_for_size: target_longest_side must be positive, got %d",
                            target_longest_side));
  const std::vector<uint8_t> bytes = read_file(path);
  return decode_any(bytes.data(), bytes.size(), path, target_longest_side);
}

uint8_t* DecodeScratch::pixels(size_t bytes) {
  if (bytes > capacity_) {
    pixels_.reset(new uint8_t[bytes]);
    capacity_ = bytes;
  }
  return pixels_.get();
}

torch::Tensor decode_image_for_size(const std::string& path, int target_longest_side, DecodeScratch& scratch) {
  if (target_longest_side < 0)
    throw UsageError(strfmt("decode_image_for_size: target_longest_side must be >= 0, got %d",
                            target_longest_side));
  std::vector<uint8_t>& bytes = scratch.file();
  read_file_into(path, bytes);
  return decode_any(bytes.data(), bytes.size(), path, target_longest_side, &scratch);
}

ImageSize probe_image_size(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT)
      throw DataError(strfmt("image not found: '%s'", path.c_str()), "", "data_not_found");
    throw DataError(strfmt("cannot open image '%s': %s", path.c_str(), std::strerror(errno)));
  }
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, std::fclose);
  uint8_t head[32];
  const size_t n = std::fread(head, 1, sizeof head, f);
  switch (sniff(head, n)) {
    case Format::Png: {
      // Signature, then IHDR: length(4) "IHDR"(4) width(4) height(4), big-endian.
      if (n < 24 || std::memcmp(head + 12, "IHDR", 4) != 0)
        throw DataError(strfmt("cannot read PNG header of '%s'", path.c_str()));
      auto be32 = [](const uint8_t* p) {
        return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
      };
      const int64_t w = be32(head + 16), h = be32(head + 20);
      check_dimensions(w, h, path);
      return {static_cast<int>(h), static_cast<int>(w)};
    }
    case Format::Bmp: {
      if (n < 26) throw DataError(strfmt("cannot read BMP header of '%s'", path.c_str()));
      const int64_t w = static_cast<int32_t>(le32(head + 18));
      const int64_t h = std::abs(int64_t(static_cast<int32_t>(le32(head + 22))));
      check_dimensions(w, h, path);
      return {static_cast<int>(h), static_cast<int>(w)};
    }
    case Format::Jpeg: {
      // EXIF/ICC segments can put the frame header far into the file: let libjpeg read on
      // from the start in its own blocks and stop at the frame header.
      std::rewind(f);
      JpegDecodeSession s;
      if (!jpeg_header_phase(s, nullptr, 0, f, 0))
        throw DataError(strfmt("cannot read JPEG header of '%s': %s", path.c_str(),
                               s.err.message));
      check_dimensions(s.cinfo.image_width, s.cinfo.image_height, path);
      return {static_cast<int>(s.cinfo.image_height), static_cast<int>(s.cinfo.image_width)};
    }
    case Format::Other:
      break;
  }
  throw DataError(strfmt("cannot read image header of '%s': %s", path.c_str(),
                         describe_unsupported(head, n).c_str()));
}

std::string encode_jpeg(const torch::Tensor& hwc_rgb, int quality) {
  check_encodable(hwc_rgb, "encode_jpeg");
  if (quality < 1 || quality > 100)
    throw UsageError(strfmt("encode_jpeg: quality must be in [1, 100], got %d", quality));
  const torch::Tensor img = hwc_rgb.contiguous();
  JpegEncodeSession s;
  if (!jpeg_encode_phase(s, img.data_ptr<uint8_t>(), int(img.size(0)), int(img.size(1)),
                         int(img.size(2)), quality))
    throw RuntimeError(strfmt("JPEG encoding failed: %s", s.err.message));
  return std::string(reinterpret_cast<const char*>(s.buffer), s.size);
}

std::string encode_png(const torch::Tensor& hwc_rgb) {
  check_encodable(hwc_rgb, "encode_png");
  const torch::Tensor img = hwc_rgb.contiguous();
  const int height = int(img.size(0)), width = int(img.size(1)), channels = int(img.size(2));
  PngEncodeSession s;
  s.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &s, png_on_write_error, png_on_warning);
  if (s.png) s.info = png_create_info_struct(s.png);
  if (!s.png || !s.info) throw RuntimeError("PNG encoding failed: out of memory");
  std::vector<png_bytep> rows(height);
  uint8_t* base = img.data_ptr<uint8_t>();
  for (int y = 0; y < height; ++y) rows[y] = base + size_t(y) * width * channels;
  if (!png_encode_phase(s, rows.data(), height, width, channels))
    throw RuntimeError(strfmt("PNG encoding failed: %s", s.message));
  return std::move(s.out);
}

void save_image(const std::string& path, const torch::Tensor& hwc_rgb, int jpeg_quality) {
  const std::string ext = lower_extension(path);
  std::string bytes;
  if (ext == "jpg" || ext == "jpeg")
    bytes = encode_jpeg(hwc_rgb, jpeg_quality);
  else if (ext == "png")
    bytes = encode_png(hwc_rgb);
  else
    throw UsageError(strfmt("cannot save image '%s': the extension must be .jpg, .jpeg or .png",
                            path.c_str()));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    throw RuntimeError(strfmt("cannot write image '%s': %s", path.c_str(), std::strerror(errno)));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) throw RuntimeError(strfmt("cannot write image '%s'", path.c_str()));
}

bool has_image_extension(const std::string& path) {
  static const char* const kExtensions[] = {"jpg", "jpeg", "png", "bmp"};
  const std::string ext = lower_extension(path);
  return std::any_of(std::begin(kExtensions), std::end(kExtensions),
                     [&](const char* e) { return ext == e; });
}

bool has_unread_image_extension(const std::string& path) {
  static const char* const kExtensions[] = {"gif", "tif", "tiff", "webp", "pfm", "heic", "avif", "jp2"};
  const std::string ext = lower_extension(path);
  return std::any_of(std::begin(kExtensions), std::end(kExtensions),
                     [&](const char* e) { return ext == e; });
}

}  // namespace libreyolo::io
