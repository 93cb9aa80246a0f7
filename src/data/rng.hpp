// Small, portable random generator for the data pipeline.
//
// std:: distributions are implementation-defined, so they would make augmentation differ between
// standard libraries; everything here is spelled out. Each sample gets its own generator derived
// from (seed, epoch, position, rank), which makes a run independent of thread scheduling.
#pragma once
#include <cmath>
#include <cstdint>

namespace libreyolo::data {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t s = seed;
    for (auto& w : s_) w = splitmix64(s);
  }

  // The generator of one sample: the tuple is hashed so that neighbouring positions, epochs or
  // ranks give unrelated streams.
  static Rng for_sample(uint64_t seed, int64_t epoch, int64_t position, int rank) {
    uint64_t h = seed;
    uint64_t k = splitmix64(h);
    k ^= static_cast<uint64_t>(epoch);
    k = splitmix64(k);
    k ^= static_cast<uint64_t>(static_cast<int64_t>(rank));
    k = splitmix64(k);
    k ^= static_cast<uint64_t>(position);
    return Rng(splitmix64(k));
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  // Uniform integer in [lo, hi] (both inclusive), unbiased.
  int64_t randint(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    if (span == 0) return static_cast<int64_t>(next_u64());  // the full 64-bit range
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return lo + static_cast<int64_t>(x % span);
  }

  // Standard normal (Box-Muller, one of the pair).
  double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * uniform());
  }

  // Gamma(shape, 1) for shape >= 1 (Marsaglia and Tsang).
  double gamma(double shape) {
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
      if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }

  double beta(double a, double b) {
    const double x = gamma(a);
    const double y = gamma(b);
    return x / (x + y);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace libreyolo::data
