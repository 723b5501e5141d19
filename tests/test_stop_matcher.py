"""Stop strings in streamed text: TextStreamer (with its StopMatcher) against a direct
definition, over random stop sets and random cuts of the text into tokens; and the work
per character, counted, not timed, whatever the number and length of the stop strings."""

from __future__ import annotations

import pytest

from edgeprefill.sdk.stop_matcher import StopMatcher
from edgeprefill.sdk.tokenizer import TextStreamer

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class PieceTokenizer:
    """Token i decodes to pieces[i]: any cut of a text into tokens."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def stop_cut(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the text ends: before the stop string that completes first, the longest of
    those completing at the same character; None without one."""
    for end in range(1, len(text) + 1):
        done = [len(s) for s in stops if text.endswith(s, 0, end)]
        if done:
            return end - max(done)
    return None


def stop_winner(text: str, stops: tuple[str, ...]) -> str | None:
    """The stop string that ends the text (stop_cut's), None without one."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text.endswith(s, 0, end)]
        if done:
            return max(done, key=len)
    return None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    return max(n for s in stops for n in range(len(s)) if text.endswith(s[:n]))


def cut_into_pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


@st.composite
def cases(draw):
    alphabet = draw(st.sampled_from(["ab", "abc", "aab"]))  # small: stop strings overlap
    word = st.text(alphabet, min_size=1, max_size=6)
    stops = tuple(draw(st.lists(word, min_size=1, max_size=5)))
    text = draw(st.text(alphabet, max_size=40))
    cuts = draw(st.lists(st.integers(0, 40), max_size=40))
    return stops, cut_into_pieces(text, cuts)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_streamed_text_matches_the_definition_for_any_cut_into_tokens(case):
    stops, pieces = case
    streamer = TextStreamer(PieceTokenizer(pieces), stops)
    shown, seen = "", ""
    for token_id, piece in enumerate(pieces):
        shown += streamer.push(token_id)
        seen += piece
        cut = stop_cut(seen, stops)
        assert streamer.stopped == (cut is not None)
        if streamer.stopped:
            assert shown == seen[:cut]
            assert streamer.stop_string == stop_winner(seen, stops)  # what stop_reason names
            break
        keep = held_back(seen, stops)  # exactly this much is held back: no more, no less
        assert len(streamer.held) == keep
        assert shown == seen[: len(seen) - keep]
    shown += streamer.flush()
    text = "".join(pieces)
    cut = stop_cut(text, stops)
    assert shown == (text if cut is None else text[:cut])


@pytest.mark.parametrize("pieces", [["abcd"], ["a", "b", "c", "d"], ["ab", "cd"]])
def test_the_stop_string_that_completes_first_wins(pieces):
    # "bc" ends before "abcd" does, however the text is cut into tokens (the earliest
    # start among the stop strings in one token's text had won: "" for ["abcd"]).
    streamer = TextStreamer(PieceTokenizer(pieces), ("abcd", "bc"))
    shown = ""
    for token_id in range(len(pieces)):
        shown += streamer.push(token_id)
        if streamer.stopped:
            break
    assert streamer.stopped and shown == "a" and streamer.stop_string == "bc"


def test_of_stop_strings_ending_together_the_longest_wins():
    streamer = TextStreamer(PieceTokenizer(["yx", "abc"]), ("bc", "xabc", "abc"))
    assert streamer.push(0) == "y"  # "x" could begin "xabc"
    assert streamer.push(1) == ""  # "xabc", "abc" and "bc" all end here
    assert streamer.stopped and streamer.flush() == ""
    assert streamer.stop_string == "xabc"


class CountingList(list):
    """A StopMatcher table that counts its reads: one per automaton step."""

    reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


def long_stops(count: int, length: int) -> tuple[str, ...]:
    # All begin with the "abab..." the text repeats, so the text keeps matching the start
    # of every one of them; each ends in a character the text never has.
    return tuple(("ab" * length)[: length - 1] + chr(0x4E00 + i) for i in range(count))


@pytest.mark.parametrize("stops", [
    ("abx",), long_stops(1, 190), long_stops(900, 190),
    tuple(chr(0x4E00 + i) for i in range(45_000)),  # many one-character stop strings
], ids=["one-short", "one-long", "900-long", "45000-one-char"])
def test_work_per_character_does_not_grow_with_the_stop_strings(stops):
    text = "ab" * 1000
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    streamer = TextStreamer(PieceTokenizer(pieces), stops)
    matcher = streamer.matcher
    assert matcher is not None
    matcher._goto = steps = CountingList(matcher._goto)
    fed = []
    feed = matcher.feed
    matcher.feed = lambda new: fed.append(new) or feed(new)  # type: ignore[method-assign]
    shown = ""
    for token_id in range(len(pieces)):
        held, before = matcher.held, steps.reads
        shown += streamer.push(token_id)
        # One step per new character, plus one per failure link followed; each link
        # shortens the match, which each character lengthens by at most one...
        assert steps.reads - before <= 2 * len(pieces[token_id]) + held
    shown += streamer.flush()
    assert not streamer.stopped and shown == text
    assert fed[: len(pieces)] == pieces  # only each token's new text is read
    # ...and a whole stream at most two per character, however many and long they are.
    assert len(text) <= steps.reads <= 2 * len(text)


def test_matcher_finds_stop_strings_begun_in_earlier_text():
    matcher = StopMatcher(["hello world", "lo w"])
    assert matcher.feed("hel") is None and matcher.held == 3
    assert matcher.feed("lo") is None and matcher.held == 5
    assert matcher.feed(" wor") == -2  # "lo w" completes first; it began 2 characters back
