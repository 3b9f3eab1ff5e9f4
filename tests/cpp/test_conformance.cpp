// The conformance driver (STYLE.md 8): every applicable implementation of every op, forced one at a time,
// against the float64 reference, on the CPU and (when present) every CUDA device. Each case prints as one
// replayable line. STRATA_CONFORMANCE_DEVICES=cuda skips the CPU. To replay one: STRATA_ATK_CASE='<line>' STRATA_FORCE_IMPL=<impl> strata_tests
// --gtest_filter='Conformance.*'. STRATA_CONFORMANCE_MATCH=<text> keeps only the cases whose line contains <text>
// (!<text>: those whose line does not).
// Cases are counted per (device, implementation) and the counts printed; over the whole list, an implementation
// that ran no case (it rejected or skipped every one) fails the test: a summed count would let it pass silently.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "testkit/testkit.h"

namespace strata::atk {
namespace {

// Every device by default; STRATA_CONFORMANCE_DEVICES=cuda (as scripts/gpu_check.sh sets) leaves the CPU out
// when the CPU implementations are covered elsewhere and device time is short (without a GPU, the CPU runs).
std::vector<strata_device> devices() {
  const char* only = std::getenv("STRATA_CONFORMANCE_DEVICES");
  const bool cpu = !only || std::string(only) != "cuda";
  std::vector<strata_device> d;
  if (cpu) d.push_back({STRATA_DEVICE_CPU, 0});
  int32_t n = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS)
    for (int32_t i = 0; i < n; ++i) d.push_back({STRATA_DEVICE_CUDA, i});
  if (d.empty()) d.push_back({STRATA_DEVICE_CPU, 0});  // no GPU answered: the CPU after all
  return d;
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, EveryImplementationMatchesFloat64) {
  const std::string op = GetParam();
  std::unique_ptr<OpHarness> harness;
  for (auto& h : all_harnesses())
    if (h->op() == op) harness = std::move(h);
  ASSERT_TRUE(harness) << op;
  const char* only = std::getenv("STRATA_ATK_CASE");
  const char* match = std::getenv("STRATA_CONFORMANCE_MATCH");
  std::vector<Case> cases;
  if (only && *only) {
    const Case c = Case::parse(only);
    if (c.op() != op) GTEST_SKIP() << "STRATA_ATK_CASE is for " << c.op();
    cases.push_back(c);
  } else {
    const bool negate = match && match[0] == '!';
    const std::string text = match ? match + (negate ? 1 : 0) : "";
    for (Case& c : harness->conformance_cases())
      if (text.empty() || (c.str().find(text) != std::string::npos) != negate) cases.push_back(std::move(c));
    if (cases.empty()) GTEST_SKIP() << "no case of " << op << " matches STRATA_CONFORMANCE_MATCH=" << match;
  }
  const bool whole_list = !(only && *only) && !(match && *match);
  int run = 0, failed = 0;
  for (const strata_device& dev : devices()) {
    const char* dev_name = dev.type == STRATA_DEVICE_CPU ? "cpu" : "cuda";
    for (const std::string& impl : impls_for(op, dev)) {
      int impl_run = 0, impl_skipped = 0;
      std::string skip_reason;  // the first one, for the message when nothing ran
      for (const Case& c : cases) {
        const CaseResult r = run_forced(*harness, c, dev, impl);
        if (r.skipped) {
          if (impl_skipped++ == 0) skip_reason = r.message;
          continue;
        }
        ++run, ++impl_run;
        if (!r.pass) {
          ++failed;
          ADD_FAILURE() << c.str() << " device=" << dev_name << " impl=" << impl << ": " << r.str();
        }
      }
      std::printf("[conformance] %s device=%s impl=%s: %d cases run, %d skipped\n", op.c_str(), dev_name,
                  impl.c_str(), impl_run, impl_skipped);
      // Over the whole list every implementation offered on this device must run some case (a case it applies
      // to belongs in the list); a filtered list may leave an implementation nothing.
      if (whole_list)
        EXPECT_GT(impl_run, 0) << op << " device=" << dev_name << " impl=" << impl << " ran none of the "
                               << cases.size() << " cases; first skip: " << skip_reason;
    }
  }
  std::printf("[conformance] %s: %d cases run, %d failed\n", op.c_str(), run, failed);
  EXPECT_GT(run, 0);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (auto& h : all_harnesses()) names.push_back(h->op());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, Conformance, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace strata::atk
