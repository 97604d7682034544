// Stop strings over text that arrives in pieces: held back while they may still match, excluded
// from the output when they do, released when they cannot; and the same through the detokenizer.
#include <gtest/gtest.h>

#include "server/output_text.h"
#include "server/stop_matcher.h"

namespace nibble {
namespace {

// Feeds `pieces` one by one; returns everything released and whether it stopped.
std::pair<std::string, bool> feed(std::vector<std::string> stops,
                                  const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const std::string& p : pieces) out += m.push(p).text;
  out += m.flush();
  return {out, m.state() == StopState::kStopped};
}

TEST(StopMatcher, NoStopsPassesEverythingAtOnce) {
  StopMatcher m({});
  EXPECT_EQ(m.push("hello ").text, "hello ");
  EXPECT_EQ(m.push("world").text, "world");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, MatchWithinOnePiece) {
  EXPECT_EQ(feed({"END"}, {"abc END def"}), std::make_pair(std::string("abc "), true));
}

TEST(StopMatcher, MatchAcrossPiecesHoldsBackThePrefix) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.push("text #").text, "text ");  // "#" may start "###"
  EXPECT_EQ(m.push("#").text, "");
  const StopMatcher::Result r = m.push("# tail");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.state, StopState::kStopped);
  EXPECT_EQ(m.push("more").text, "");  // nothing after a stop
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xab").text, "x");
  EXPECT_EQ(m.push("d").text, "abd");
  EXPECT_EQ(m.state(), StopState::kOpen);
}

TEST(StopMatcher, HeldTextIsReleasedAtTheEnd) {
  EXPECT_EQ(feed({"STOP"}, {"almost ST", "O"}), std::make_pair(std::string("almost STO"), false));
}

TEST(StopMatcher, EarliestMatchWinsAmongSeveralStops) {
  EXPECT_EQ(feed({"world", "lo"}, {"hello world"}).first, "hel");
  EXPECT_EQ(feed({"o w", "xyz"}, {"hell", "o", " ", "wor"}).first, "hell");
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" inside "aaab": the held tail must keep the longest possible start, not the first.
  EXPECT_EQ(feed({"aab"}, {"a", "a", "a", "b", "c"}), std::make_pair(std::string("a"), true));
}

TEST(StopMatcher, MultiByteCharacters) {
  EXPECT_EQ(feed({"é!"}, {"caf", "é", "!", "x"}), std::make_pair(std::string("caf"), true));
  EXPECT_EQ(feed({"日本"}, {"今日", "は"}), std::make_pair(std::string("今日は"), false));
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  EXPECT_EQ(feed({""}, {"abc"}), std::make_pair(std::string("abc"), false));
}

TEST(OutputText, StopsOnDetokenizedText) {
  const Tokenizer tokenizer = Tokenizer::load("tests/fixtures/tiny-mixtral");
  const std::vector<int32_t> ids =
      tokenizer.encode("The quick brown fox jumps", AddSpecialTokens::kNo);
  OutputText plain(tokenizer, {});
  std::string all;
  for (int32_t id : ids) all += plain.push(id);
  all += plain.finish();
  EXPECT_EQ(all, tokenizer.decode(ids));

  OutputText stopping(tokenizer, {"brown"});
  std::string out;
  for (int32_t id : ids) out += stopping.push(id);
  out += stopping.finish();
  EXPECT_TRUE(stopping.stopped());
  EXPECT_EQ(out, all.substr(0, all.find("brown")));
  EXPECT_LT(stopping.num_tokens(), static_cast<int64_t>(ids.size()));
}

}  // namespace
}  // namespace nibble
