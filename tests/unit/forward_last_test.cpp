// Backend::forward_last, the decode loops' call: the last token's logits as a view of the backend's
// own memory must be forward()'s logits, and its requests are checked as forward's are.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "expect_error.h"
#include "tiny_model.h"

namespace kiln {
namespace {

using test::expect_error;

TEST(ForwardLast, GivesForwardsLogitsOverAPromptAndDecodeSteps) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  auto by_view = backend->new_sequence(32), by_vector = backend->new_sequence(32);
  const std::vector<int32_t> prompt = {5, 17, 3, 88, 41, 2, 60, 9, 33};
  std::vector<float> expected;
  backend->forward(*by_vector, prompt, false, expected);
  std::span<float> got = backend->forward_last(*by_view, prompt);
  ASSERT_EQ(got.size(), size_t(97));
  ASSERT_EQ(std::vector<float>(got.begin(), got.end()), expected);
  for (int step = 0; step < 6; ++step) {
    const int32_t token = int32_t((step * 31 + 7) % 97);
    backend->forward(*by_vector, std::span<const int32_t>(&token, 1), false, expected);
    got = backend->forward_last(*by_view, std::span<const int32_t>(&token, 1));
    ASSERT_EQ(std::vector<float>(got.begin(), got.end()), expected) << "step " << step;
  }
  EXPECT_EQ(by_view->n_past(), by_vector->n_past());
}

TEST(ForwardLast, RejectsWhatForwardRejectsAndKeepsTheSequence) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  auto seq = backend->new_sequence(4);
  const std::vector<int32_t> prompt = {1, 2, 3};
  backend->forward_last(*seq, prompt);
  const int32_t outside = 97;
  expect_error([&] { backend->forward_last(*seq, std::span<const int32_t>(&outside, 1)); }, "outside the vocabulary",
               Errc::invalid_argument);
  expect_error([&] { backend->forward_last(*seq, prompt); }, "exceed the sequence's KV capacity",
               Errc::invalid_argument);
  expect_error([&] { backend->forward_last(*seq, std::span<const int32_t>()); }, "at least one token",
               Errc::invalid_argument);
  EXPECT_EQ(seq->n_past(), 3);
}

}  // namespace
}  // namespace kiln
