// Image decode/encode. Unusual files (16-bit, palette, alpha, interlaced PNGs; CMYK JPEGs) are
// written here with libpng/libjpeg directly, so the decoder is checked against files it did not
// produce itself.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <png.h>

#include <libreyolo/errors.hpp>

#include "io/image.hpp"
#include "ops/image_ops.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
using libreyolo::DataError;
using libreyolo::UsageError;

namespace {

std::string write_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

torch::Tensor random_image(int64_t h, int64_t w, int64_t c = 3, uint64_t seed = 1) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, {h, w, c}, torch::kUInt8);
}

// Smooth content (gradients and a disc) that JPEG reproduces closely.
torch::Tensor smooth_image(int64_t h, int64_t w) {
  auto img = torch::empty({h, w, 3}, torch::kUInt8);
  auto a = img.accessor<uint8_t, 3>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const double dx = x - w * 0.6, dy = y - h * 0.4;
      const bool disc = dx * dx + dy * dy < (h * 0.2) * (h * 0.2);
      a[y][x][0] = static_cast<uint8_t>(disc ? 220 : 255 * x / w);
      a[y][x][1] = static_cast<uint8_t>(disc ? 40 : 255 * y / h);
      a[y][x][2] = static_cast<uint8_t>(disc ? 60 : 128);
    }
  return img;
}

double mean_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().mean().item<double>();
}

int max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kInt) - b.to(torch::kInt)).abs().max().item<int>();
}

// ---- a PNG writer over libpng with full control of the format
struct PngSpec {
  int width, height, bit_depth, color_type;
  bool interlaced = false;
  std::vector<uint8_t> palette_rgb;   // for PNG_COLOR_TYPE_PALETTE
  std::vector<uint8_t> trns;          // palette alpha entries
  std::vector<uint8_t> rows;          // packed rows as libpng expects them (16-bit big-endian)
};

void append_png(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), n);
}

std::string write_png(const PngSpec& spec) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng failed to write the test file";
    return {};
  }
  png_set_write_fn(png, &out, append_png, nullptr);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> pal;
  for (size_t i = 0; i + 2 < spec.palette_rgb.size(); i += 3)
    pal.push_back({spec.palette_rgb[i], spec.palette_rgb[i + 1], spec.palette_rgb[i + 2]});
  if (!pal.empty()) png_set_PLTE(png, info, pal.data(), static_cast<int>(pal.size()));
  if (!spec.trns.empty())
    png_set_tRNS(png, info, spec.trns.data(), static_cast<int>(spec.trns.size()), nullptr);
  png_write_info(png, info);
  const size_t row_bytes = spec.rows.size() / spec.height;
  std::vector<png_bytep> rows(spec.height);
  for (int y = 0; y < spec.height; ++y)
    rows[y] = const_cast<uint8_t*>(spec.rows.data()) + y * row_bytes;
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// ---- a JPEG writer over libjpeg for CMYK input
std::string write_cmyk_jpeg(const std::vector<uint8_t>& cmyk, int w, int h, bool adobe_marker) {
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 4;
  c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, JCS_CMYK);  // stored as given, no YCCK transform
  c.write_Adobe_marker = adobe_marker ? TRUE : FALSE;
  jpeg_set_quality(&c, 100, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(cmyk.data()) + c.next_scanline * w * 4;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::string out(reinterpret_cast<char*>(buf), size);
  jpeg_destroy_compress(&c);
  free(buf);
  return out;
}

torch::Tensor decode(const std::string& bytes, const std::string& name = "mem") {
  return io::decode_image_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                name);
}

uint32_t crc32_of(const std::string& s, size_t begin, size_t end) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = begin; i < end; ++i) {
    crc ^= static_cast<uint8_t>(s[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put_be32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (24 - 8 * i));
}

// Expects DataError whose message names `name` and contains `fragment`.
template <typename F>
void expect_data_error(F&& f, const std::string& name, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no DataError (expected one mentioning '" << fragment << "')";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(e.exit_code(), 3);
  }
}

}  // namespace

TEST(ImageIO, PngRoundTripIsExact) {
  const auto img = random_image(37, 53);
  const std::string bytes = io::encode_png(img);
  const auto back = decode(bytes);
  ASSERT_EQ(back.sizes(), img.sizes());
  EXPECT_TRUE(torch::equal(back, img));

  // Through a file, with a non-contiguous input (a crop).
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const auto crop = img.slice(1, 5, 40);
  io::save_image(dir + "/crop.PNG", crop);
  EXPECT_TRUE(torch::equal(io::decode_image(dir + "/crop.PNG"), crop.contiguous()));
  const auto size = io::probe_image_size(dir + "/crop.PNG");
  EXPECT_EQ(size.height, 37);
  EXPECT_EQ(size.width, 35);
}

TEST(ImageIO, JpegRoundTripWithinTolerance) {
  const auto img = smooth_image(96, 128);
  const auto back = decode(io::encode_jpeg(img, 95));
  ASSERT_EQ(back.sizes(), img.sizes());
  EXPECT_LT(mean_abs_diff(back, img), 1.5);
  // Lower quality gives a smaller file and a larger (but bounded) error.
  const std::string q50 = io::encode_jpeg(img, 50);
  EXPECT_LT(q50.size(), io::encode_jpeg(img, 95).size());
  const double err50 = mean_abs_diff(decode(q50), img);
  EXPECT_LT(err50, 4.0);

  const std::string dir = libreyolo::test::temp_dir("imgio");
  io::save_image(dir + "/a.jpeg", img);
  const auto size = io::probe_image_size(dir + "/a.jpeg");
  EXPECT_EQ(size.height, 96);
  EXPECT_EQ(size.width, 128);
  EXPECT_LT(mean_abs_diff(io::decode_image(dir + "/a.jpeg"), img), 1.5);
}

TEST(ImageIO, GreyImagesBecomeRgb) {
  const auto grey = random_image(20, 30, 1, 7);
  const auto expected = grey.expand({20, 30, 3});
  EXPECT_TRUE(torch::equal(decode(io::encode_png(grey)), expected));

  const auto smooth = smooth_image(64, 64).select(2, 1).unsqueeze(2).contiguous();
  const auto from_jpeg = decode(io::encode_jpeg(smooth, 95));
  ASSERT_EQ(from_jpeg.sizes(), torch::IntArrayRef({64, 64, 3}));
  EXPECT_TRUE(torch::equal(from_jpeg.select(2, 0), from_jpeg.select(2, 1)));
  EXPECT_TRUE(torch::equal(from_jpeg.select(2, 0), from_jpeg.select(2, 2)));
  EXPECT_LT(mean_abs_diff(from_jpeg.select(2, 0), smooth.select(2, 0)), 1.0);
}

TEST(ImageIO, PngAlphaIsDropped) {
  PngSpec rgba{5, 4, 8, PNG_COLOR_TYPE_RGB_ALPHA};
  PngSpec ga{5, 4, 8, PNG_COLOR_TYPE_GRAY_ALPHA};
  auto expected_rgba = torch::empty({4, 5, 3}, torch::kUInt8);
  auto expected_ga = torch::empty({4, 5, 3}, torch::kUInt8);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 5; ++x) {
      const uint8_t r = 10 * x + y, g = 200 - 7 * y, b = 3 * x * y, a = (x + y) % 2 ? 0 : 128;
      rgba.rows.insert(rgba.rows.end(), {r, g, b, a});
      ga.rows.insert(ga.rows.end(), {r, a});
      for (int c = 0; c < 3; ++c) {
        expected_rgba[y][x][c] = c == 0 ? r : c == 1 ? g : b;
        expected_ga[y][x][c] = r;
      }
    }
  EXPECT_TRUE(torch::equal(decode(write_png(rgba)), expected_rgba));
  EXPECT_TRUE(torch::equal(decode(write_png(ga)), expected_ga));
}

TEST(ImageIO, Png16BitPaletteLowDepthAndInterlaced) {
  // 16-bit RGB: the high byte is kept.
  PngSpec deep{3, 2, 16, PNG_COLOR_TYPE_RGB};
  auto expected_deep = torch::empty({2, 3, 3}, torch::kUInt8);
  for (int i = 0; i < 18; ++i) {
    const uint16_t v = static_cast<uint16_t>(i * 3641 + 17);
    deep.rows.push_back(static_cast<uint8_t>(v >> 8));
    deep.rows.push_back(static_cast<uint8_t>(v & 0xFF));
    expected_deep.view(-1)[i] = v >> 8;
  }
  EXPECT_TRUE(torch::equal(decode(write_png(deep)), expected_deep));

  // 4-bit palette with transparency entries: colours from the palette, alpha ignored.
  PngSpec pal{4, 2, 4, PNG_COLOR_TYPE_PALETTE};
  pal.palette_rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 99, 199};
  pal.trns = {0, 255, 128};
  const int idx[2][4] = {{0, 1, 2, 3}, {3, 3, 1, 0}};
  for (auto& row : idx) {
    pal.rows.push_back(static_cast<uint8_t>(row[0] << 4 | row[1]));
    pal.rows.push_back(static_cast<uint8_t>(row[2] << 4 | row[3]));
  }
  const auto got = decode(write_png(pal));
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({2, 4, 3}));
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(got[y][x][c].item<int>(), pal.palette_rgb[idx[y][x] * 3 + c]) << y << "," << x;

  // 1-bit grey: 0 -> 0, 1 -> 255.
  PngSpec bits{10, 1, 1, PNG_COLOR_TYPE_GRAY};
  bits.rows = {0b10110000, 0b01000000};  // pixels 1 0 1 1 0 0 0 0 | 0 1
  const auto b = decode(write_png(bits));
  const int expect_bits[10] = {1, 0, 1, 1, 0, 0, 0, 0, 0, 1};
  for (int x = 0; x < 10; ++x) EXPECT_EQ(b[0][x][1].item<int>(), expect_bits[x] * 255) << x;

  // Adam7 interlacing.
  const auto img = random_image(13, 11, 3, 3);
  PngSpec inter{11, 13, 8, PNG_COLOR_TYPE_RGB};
  inter.interlaced = true;
  inter.rows.assign(img.data_ptr<uint8_t>(), img.data_ptr<uint8_t>() + img.numel());
  EXPECT_TRUE(torch::equal(decode(write_png(inter)), img));
}

TEST(ImageIO, CmykJpegBecomesRgb) {
  // 16x16 flat blocks so that quality-100 JPEG keeps the values within a few levels.
  const uint8_t rgb[4][3] = {{255, 0, 0}, {0, 128, 255}, {30, 200, 90}, {250, 250, 250}};
  const int w = 32, h = 32;
  for (bool adobe : {true, false}) {
    std::vector<uint8_t> cmyk(w * h * 4);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const uint8_t* c = rgb[(y / 16) * 2 + x / 16];
        uint8_t* p = &cmyk[(y * w + x) * 4];
        // K = 0 ink. Adobe files store inverted values (255 = no ink), plain ones ink amounts.
        for (int k = 0; k < 3; ++k) p[k] = adobe ? c[k] : static_cast<uint8_t>(255 - c[k]);
        p[3] = adobe ? 255 : 0;
      }
    const auto got = decode(write_cmyk_jpeg(cmyk, w, h, adobe));
    ASSERT_EQ(got.sizes(), torch::IntArrayRef({h, w, 3}));
    for (int q = 0; q < 4; ++q)
      for (int c = 0; c < 3; ++c)
        EXPECT_NEAR(got[(q / 2) * 16 + 8][(q % 2) * 16 + 8][c].item<int>(), rgb[q][c], 3)
            << "adobe=" << adobe << " quadrant " << q << " channel " << c;
  }
  // Black ink halves the brightness: inverted K = 128 over white paper.
  std::vector<uint8_t> half(16 * 16 * 4);
  for (size_t i = 0; i < half.size(); i += 4) half[i] = half[i + 1] = half[i + 2] = 255, half[i + 3] = 128;
  const auto got = decode(write_cmyk_jpeg(half, 16, 16, true));
  EXPECT_NEAR(got[8][8][0].item<int>(), 128, 2);
}

TEST(ImageIO, BmpDecodes) {
  // 24-bit bottom-up 3x2 with 3 bytes of row padding, BGR order.
  auto le = [](std::string& s, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto header = [&](int w, int h, int bits, uint32_t pixel_offset, uint32_t colors) {
    std::string s = "BM";
    le(s, 0, 4), le(s, 0, 4), le(s, pixel_offset, 4);
    le(s, 40, 4), le(s, static_cast<uint32_t>(w), 4), le(s, static_cast<uint32_t>(h), 4);
    le(s, 1, 2), le(s, bits, 2), le(s, 0, 4), le(s, 0, 4), le(s, 0, 4), le(s, 0, 4);
    le(s, colors, 4), le(s, 0, 4);
    return s;
  };
  std::string bmp = header(3, 2, 24, 54, 0);
  // Stored bottom row first: row y=1 then y=0.
  const uint8_t px[2][3][3] = {{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}},
                               {{10, 11, 12}, {13, 14, 15}, {16, 17, 18}}};
  for (int y = 1; y >= 0; --y) {
    for (int x = 0; x < 3; ++x)
      for (int c = 2; c >= 0; --c) bmp.push_back(static_cast<char>(px[y][x][c]));
    bmp.append(3, '\0');
  }
  const auto got = decode(bmp, "a.bmp");
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({2, 3, 3}));
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(got[y][x][c].item<int>(), px[y][x][c]);

  // 8-bit palette, top-down (negative height).
  std::string pal = header(2, -2, 8, 54 + 3 * 4, 3);
  for (uint32_t bgr : {0x000000FFu, 0x0000FF00u, 0x00FF0000u}) le(pal, bgr, 4);  // B, G, R
  pal += std::string("\x00\x01\x00\x00\x02\x00\x00\x00", 8);
  const auto p = decode(pal, "p.bmp");
  ASSERT_EQ(p.sizes(), torch::IntArrayRef({2, 2, 3}));
  EXPECT_EQ(p[0][0][2].item<int>(), 255);  // index 0: blue
  EXPECT_EQ(p[0][1][1].item<int>(), 255);  // index 1: green
  EXPECT_EQ(p[1][0][0].item<int>(), 255);  // index 2: red
  EXPECT_EQ(p[1][0][1].item<int>(), 0);

  expect_data_error([&] { decode(bmp.substr(0, bmp.size() - 4), "short.bmp"); }, "short.bmp",
                    "truncated");
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const auto size = io::probe_image_size(write_file(dir, "a.bmp", bmp));
  EXPECT_EQ(size.height, 2);
  EXPECT_EQ(size.width, 3);
}

TEST(ImageIO, CorruptDataIsDataError) {
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const std::string junk = write_file(dir, "junk.jpg", "this is not an image at all");
  expect_data_error([&] { io::decode_image(junk); }, junk, "unknown format");
  const std::string empty = write_file(dir, "empty.png", "");
  expect_data_error([&] { io::decode_image(empty); }, empty, "empty");
  const std::string gif = write_file(dir, "x.gif", "GIF89a\x01\x00\x01\x00");
  expect_data_error([&] { io::decode_image(gif); }, gif, "GIF");

  // JPEG magic followed by garbage.
  std::string fake_jpeg = "\xFF\xD8\xFF";
  for (int i = 0; i < 500; ++i) fake_jpeg.push_back(static_cast<char>((i * 37) & 0xFF));
  expect_data_error([&] { decode(fake_jpeg, "fake.jpg"); }, "fake.jpg", "JPEG");

  // A PNG whose IHDR checksum is wrong.
  std::string png = io::encode_png(random_image(8, 8));
  png[20] ^= 0x01;  // a byte of the height: the CRC no longer matches
  expect_data_error([&] { decode(png, "crc.png"); }, "crc.png", "PNG");

  // PNG signature followed by garbage.
  std::string fake_png = std::string("\x89PNG\r\n\x1a\n", 8) + std::string(100, 'x');
  expect_data_error([&] { decode(fake_png, "fake.png"); }, "fake.png", "PNG");

  // Missing file.
  try {
    io::decode_image(dir + "/missing.jpg");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const DataError& e) {
    EXPECT_EQ(e.code(), "data_not_found");
    EXPECT_NE(std::string(e.what()).find("missing.jpg"), std::string::npos);
  }
  EXPECT_THROW(io::probe_image_size(dir + "/missing.jpg"), DataError);
  EXPECT_THROW(io::probe_image_size(junk), DataError);
}

TEST(ImageIO, TruncatedFilesAreDataErrors) {
  const auto img = smooth_image(120, 160);
  const std::string jpeg = io::encode_jpeg(img, 90);
  // Cut inside the entropy-coded data, and inside the header.
  for (size_t keep : {jpeg.size() / 2, jpeg.size() - 10, size_t(100)})
    expect_data_error([&] { decode(jpeg.substr(0, keep), "cut.jpg"); }, "cut.jpg", "JPEG");
  expect_data_error([&] { decode(jpeg.substr(0, jpeg.size() / 2), "cut.jpg"); }, "cut.jpg",
                    "truncated");
  // Only the final EOI marker missing: the decoder reads ahead for bits and meets the end of the
  // file, so this counts as truncated too (PIL refuses such files as well).
  expect_data_error([&] { decode(jpeg.substr(0, jpeg.size() - 2), "eoi.jpg"); }, "eoi.jpg",
                    "truncated");

  const std::string png = io::encode_png(random_image(50, 40));
  for (size_t keep : {png.size() / 2, size_t(30), size_t(9)})
    expect_data_error([&] { decode(png.substr(0, keep), "cut.png"); }, "cut.png", "truncated");
}

TEST(ImageIO, AbsurdDimensionsRejectedBeforeAllocating) {
  // PNG header claiming 60000 x 60000 (3.6 G pixels), with a valid IHDR checksum.
  std::string png = io::encode_png(random_image(4, 4));
  put_be32(png, 16, 60000);
  put_be32(png, 20, 60000);
  put_be32(png, 29, crc32_of(png, 12, 29));
  expect_data_error([&] { decode(png, "big.png"); }, "big.png", "too large");
  const std::string dir = libreyolo::test::temp_dir("imgio");
  expect_data_error([&] { io::probe_image_size(write_file(dir, "big.png", png)); }, "big.png",
                    "too large");

  // JPEG frame header (SOF0) claiming 65000 x 65000.
  std::string jpeg = io::encode_jpeg(random_image(16, 16), 90);
  const size_t sof = jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  // FF C0, length(2), precision(1), height(2), width(2)
  jpeg[sof + 5] = jpeg[sof + 7] = static_cast<char>(0xFD);
  jpeg[sof + 6] = jpeg[sof + 8] = static_cast<char>(0xE8);
  expect_data_error([&] { decode(jpeg, "big.jpg"); }, "big.jpg", "too large");
}

TEST(ImageIO, ProbeReadsPastLargeJpegSegments) {
  // A 60 KB comment segment before the frame header (EXIF thumbnails look like this).
  const auto img = smooth_image(33, 47);
  std::string jpeg = io::encode_jpeg(img, 80);
  const uint16_t len = 60000;
  std::string com = "\xFF\xFE";
  com.push_back(static_cast<char>(len >> 8));
  com.push_back(static_cast<char>(len & 0xFF));
  com.append(len - 2, 'c');
  jpeg.insert(2, com);
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const std::string path = write_file(dir, "com.jpg", jpeg);
  const auto size = io::probe_image_size(path);
  EXPECT_EQ(size.height, 33);
  EXPECT_EQ(size.width, 47);
  EXPECT_EQ(io::decode_image(path).sizes(), torch::IntArrayRef({33, 47, 3}));
}

TEST(ImageIO, DecodeForSizeUsesDctScaling) {
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const auto img = smooth_image(810, 1080);
  const std::string path = dir + "/big.jpg";
  io::save_image(path, img, 95);
  // Smallest of 1/8, 1/4, 1/2 with ceil(1080 n / 8) >= target, else full size.
  const auto half = io::decode_image_for_size(path, 540);
  ASSERT_EQ(half.sizes(), torch::IntArrayRef({405, 540, 3}));
  // It looks like the full decode resized down.
  const auto reference = libreyolo::ops::resize_bilinear(io::decode_image(path), 405, 540);
  EXPECT_LT(mean_abs_diff(half, reference), 2.0);
  EXPECT_EQ(io::decode_image_for_size(path, 100).sizes(), torch::IntArrayRef({102, 135, 3}));
  EXPECT_EQ(io::decode_image_for_size(path, 135).sizes(), torch::IntArrayRef({102, 135, 3}));
  EXPECT_EQ(io::decode_image_for_size(path, 136).sizes(), torch::IntArrayRef({203, 270, 3}));
  EXPECT_EQ(io::decode_image_for_size(path, 271).sizes(), torch::IntArrayRef({405, 540, 3}));
  EXPECT_EQ(io::decode_image_for_size(path, 541).sizes(), torch::IntArrayRef({810, 1080, 3}));
  EXPECT_EQ(io::decode_image_for_size(path, 5000).sizes(), torch::IntArrayRef({810, 1080, 3}));
  // PNG: plain decode.
  const auto small = random_image(30, 20);
  io::save_image(dir + "/s.png", small);
  EXPECT_TRUE(torch::equal(io::decode_image_for_size(dir + "/s.png", 5), small));
  EXPECT_THROW(io::decode_image_for_size(path, 0), UsageError);
}

TEST(ImageIO, DecodeIntoScratchGivesTheSamePixels) {
  const std::string dir = libreyolo::test::temp_dir("imgio_scratch");
  const std::string big = dir + "/big.jpg", png = dir + "/s.png", small = dir + "/small.jpg";
  io::save_image(big, smooth_image(810, 1080), 90);
  io::save_image(png, random_image(30, 20));
  io::save_image(small, smooth_image(20, 30), 90);
  io::DecodeScratch scratch;
  // Large, then smaller images through the same memory; each equals the allocating decode.
  for (const auto& [path, target] : std::vector<std::pair<std::string, int>>{
           {big, 640}, {big, 540}, {png, 7}, {small, 0}, {big, 0}, {small, 30}}) {
    const torch::Tensor want = target > 0 ? io::decode_image_for_size(path, target) : io::decode_image(path);
    const torch::Tensor got = io::decode_image_for_size(path, target, scratch);
    ASSERT_TRUE(torch::equal(got, want)) << path << " at " << target;
  }
  EXPECT_THROW(io::decode_image_for_size(big, -1, scratch), UsageError);
  EXPECT_THROW(io::decode_image_for_size(dir + "/missing.jpg", 64, scratch), libreyolo::DataError);
}

TEST(ImageIO, EncoderArgumentChecks) {
  const std::string dir = libreyolo::test::temp_dir("imgio");
  const auto img = random_image(4, 4);
  EXPECT_THROW(io::save_image(dir + "/x.gif", img), UsageError);
  EXPECT_THROW(io::save_image(dir + "/noext", img), UsageError);
  EXPECT_THROW(io::encode_png(img.to(torch::kFloat)), UsageError);
  EXPECT_THROW(io::encode_png(torch::zeros({4, 4, 2}, torch::kUInt8)), UsageError);
  EXPECT_THROW(io::encode_jpeg(torch::zeros({4, 4}, torch::kUInt8)), UsageError);
  EXPECT_THROW(io::encode_jpeg(img, 0), UsageError);
  EXPECT_THROW(io::encode_jpeg(img, 101), UsageError);
  EXPECT_THROW(io::save_image(dir + "/no/such/dir/x.png", img), libreyolo::RuntimeError);
}

TEST(ImageIO, ImageExtensions) {
  // Listed: what the decoder reads. Other image formats are recognised, to be skipped with a word.
  for (const char* p : {"a.jpg", "b.JPEG", "dir.x/c.png", "d.Bmp"}) {
    EXPECT_TRUE(io::has_image_extension(p)) << p;
    EXPECT_FALSE(io::has_unread_image_extension(p)) << p;
  }
  for (const char* p : {"e.gif", "f.tif", "g.TIFF", "h.webp", "i.pfm"}) {
    EXPECT_FALSE(io::has_image_extension(p)) << p;
    EXPECT_TRUE(io::has_unread_image_extension(p)) << p;
  }
  for (const char* p : {"a.txt", "jpg", "dir.jpg/file", "a.jpg.txt", "a.", "a.jp"}) {
    EXPECT_FALSE(io::has_image_extension(p)) << p;
    EXPECT_FALSE(io::has_unread_image_extension(p)) << p;
  }
}
