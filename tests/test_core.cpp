#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "support.hpp"

TEST(Core, StrfmtFormats) {
  EXPECT_EQ(libreyolo::strfmt("%d-%s-%.2f", 3, "x", 1.5), "3-x-1.50");
  std::string big(5000, 'a');
  EXPECT_EQ(libreyolo::strfmt("%s", big.c_str()).size(), 5000u);
}

TEST(Core, ErrorsCarryExitCodes) {
  EXPECT_EQ(libreyolo::UsageError("x").exit_code(), 2);
  EXPECT_EQ(libreyolo::DataError("x").exit_code(), 3);
  EXPECT_EQ(libreyolo::ModelError("x").exit_code(), 4);
  EXPECT_EQ(libreyolo::RuntimeError("x").exit_code(), 1);
}
