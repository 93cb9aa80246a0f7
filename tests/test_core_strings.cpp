// core/strings.hpp: the one lower/trim/starts_with of the library.
#include "core/strings.hpp"
#include "support.hpp"

namespace {

TEST(Strings, LowerChangesOnlyAsciiCapitals) {
  EXPECT_EQ(libreyolo::lower("AdamW"), "adamw");
  EXPECT_EQ(libreyolo::lower("CUDA:0 [1,2]"), "cuda:0 [1,2]");
  EXPECT_EQ(libreyolo::lower(""), "");
  // Bytes outside ASCII (here UTF-8 for "É") pass through unchanged.
  EXPECT_EQ(libreyolo::lower("\xC3\x89X"), "\xC3\x89x");
}

TEST(Strings, TrimRemovesSurroundingWhitespaceOnly) {
  EXPECT_EQ(libreyolo::trim("  cuda:1\t\n"), "cuda:1");
  EXPECT_EQ(libreyolo::trim("a b"), "a b");
  EXPECT_EQ(libreyolo::trim(" \r\v\f "), "");
  EXPECT_EQ(libreyolo::trim(""), "");
}

TEST(Strings, StartsWith) {
  EXPECT_TRUE(libreyolo::starts_with("module.head", "module."));
  EXPECT_TRUE(libreyolo::starts_with("abc", ""));
  EXPECT_FALSE(libreyolo::starts_with("mod", "module."));
  EXPECT_FALSE(libreyolo::starts_with("Module.x", "module."));
}

}  // namespace

TEST(Strings, CountsAndDurationsReadAsEnglish) {
  EXPECT_EQ(libreyolo::count_of(1, "epoch"), "1 epoch");
  EXPECT_EQ(libreyolo::count_of(0, "epoch"), "0 epochs");
  EXPECT_EQ(libreyolo::count_of(1, "batch", "batches"), "1 batch");
  EXPECT_EQ(libreyolo::count_of(7, "batch", "batches"), "7 batches");
  EXPECT_EQ(libreyolo::duration_text(0.04), "0.0 s");
  EXPECT_EQ(libreyolo::duration_text(42.26), "42.3 s");
  EXPECT_EQ(libreyolo::duration_text(245.0), "4 min 05 s");
  EXPECT_EQ(libreyolo::duration_text(7620.0), "2 h 07 min");
  EXPECT_EQ(libreyolo::duration_text(-3.0), "0.0 s");
}

TEST(Strings, DisplayWidthCountsColumnsNotBytes) {
  EXPECT_EQ(libreyolo::display_width("cat"), 3);
  EXPECT_EQ(libreyolo::display_width("k\xC3\xA4tzchen"), 8);        // a-umlaut: 2 bytes, 1 column
  EXPECT_EQ(libreyolo::display_width("\xE7\x8C\xAB"), 2);            // a CJK ideograph: 3 bytes, 2 columns
  EXPECT_EQ(libreyolo::display_width("e\xCC\x81"), 1);               // e + combining acute accent
  EXPECT_EQ(libreyolo::display_width("\xFF" "a"), 2);                // an invalid byte counts as one
  EXPECT_EQ(libreyolo::pad_left("\xE7\x8C\xAB", 5), "   \xE7\x8C\xAB");
  EXPECT_EQ(libreyolo::pad_left("toolong", 3), "toolong");
}
