"""Stop strings found in streamed text with an Aho-Corasick automaton.

Checking each generated token against every stop string costs the engine's step time in
proportion to the number and length of the request's stop strings, and that step is
shared by every client. The automaton is built once per request; after that each
character of generated text costs amortized O(1) dictionary look-ups, whatever the stop
strings are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class StopMatcher:
    """The stop strings of one request, fed the generated text as it streams.

    Its state after each character is the trie node of the longest suffix of the text fed
    so far that is a prefix of some stop string, so `held` is exactly how much of the text
    may still become a stop string: what a streamer must hold back, no more, no less.

    The stop string that wins is the one that completes first (earliest end); among those
    ending at the same character, the longest (earliest start). The result does not
    depend on how the text was cut into pieces.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        # Trie of the stop strings; node 0 is the empty prefix. Per node: its children
        # by character, its length, and the length of the longest stop string that is a
        # suffix of it (0: none) -- all a stop needs of the dictionary-suffix links.
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._stop_len = [0]
        for stop in stops:
            node = 0
            for ch in stop:
                child = self._goto[node].get(ch)
                if child is None:
                    child = len(self._goto)
                    self._goto[node][ch] = child
                    self._goto.append({})
                    self._depth.append(self._depth[node] + 1)
                    self._stop_len.append(0)
                node = child
            self._stop_len[node] = len(stop)
        # Failure links: the node of the longest proper suffix that is also in the trie.
        # Breadth first, so the shallower nodes a link walks through are final already.
        # The root's children link to the root; starting the walk from them (not the root)
        # keeps `_next` from sending a child to itself.
        self._fail = [0] * len(self._goto)
        queue = deque(self._goto[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in self._goto[node].items():
                fail = self._fail[child] = self._next(self._fail[node], ch)
                if not self._stop_len[child]:  # a stop ending here is the longest one
                    self._stop_len[child] = self._stop_len[fail]
                queue.append(child)
        self.state = 0

    @property
    def held(self) -> int:
        """Length of the longest suffix of the text fed so far that is a prefix of a stop
        string: a proper prefix, unless `feed` has just found a stop string."""
        return self._depth[self.state]

    def feed(self, text: str) -> int | None:
        """Advance over `text`; None, or where the first stop string to complete begins,
        as an index into `text` (negative where it began in text fed earlier, at most
        `held` characters back). The text after that stop string is not read."""
        state = self.state
        for i, ch in enumerate(text):
            state = self._next(state, ch)
            if self._stop_len[state]:
                self.state = state
                return i + 1 - self._stop_len[state]
        self.state = state
        return None

    def _next(self, state: int, ch: str) -> int:
        # Each failure link followed shortens the match, and each character lengthens it
        # by at most one, so the links followed over a stream never outnumber its
        # characters: amortized O(1) per character.
        goto, fail = self._goto, self._fail
        while True:
            child = goto[state].get(ch)
            if child is not None:
                return child
            if state == 0:
                return 0
            state = fail[state]
