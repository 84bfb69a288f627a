// Shared doctest entry point for every test executable. After the run, the scratch directories
// the tests made are removed if every test passed, and listed if one failed (kept_dirs.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "kept_dirs.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (!context.shouldExit()) kept_dirs::settle(status == 0);
  return status;
}
