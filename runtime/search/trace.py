"""Paths kept as parent pointers: each beam step records, for its rows, the parent row in the step before and the
token it feeds (and the attention it produced); a path is read back once, at the end, for the hypotheses kept,
instead of every row's history and attention being copied at every step."""
from __future__ import annotations

import numpy as np


class Trace:
    """Per step s: rows' parents in step s - 1 and tokens fed at step s (s >= 1), and the step's attention."""

    def __init__(self) -> None:
        self.parents: list[np.ndarray] = [np.zeros(0, np.int64)]  # step 0's rows start every path: no parent
        self.tokens: list[np.ndarray] = [np.zeros(0, np.int64)]  # step 0 feeds bos, which no path outputs
        self.attention: list[np.ndarray] = []

    def push(self, parents: np.ndarray, tokens: np.ndarray) -> None:
        """The next step's rows: parent row of each (N,) in this step, token each feeds (N,)."""
        self.parents.append(parents)
        self.tokens.append(tokens)

    def attend(self, attention: np.ndarray) -> None:
        """This step's attention (N, ..., Ls); copied, since a step may reuse its output buffers."""
        self.attention.append(np.array(attention))

    def paths(self, step: np.ndarray, row: np.ndarray,
              token: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Ids (P, L), lengths (P,) and attention (P, L, ..., Ls) or None of the paths to row `row` of step `step`,
        each (P,), then `token` where it is >= 0 (a path ended by max length; -1: ended by eos, not output).
        Entries past a path's length are filler."""
        width, starts = int(step.max(initial=0)), set(step.tolist())
        cursor = np.zeros(len(step), np.int64)  # (P,): row 0 stands in for a path until the step it ends at
        ids, att = [np.zeros(len(step), np.int64)], [self._filler(len(step))]  # position `width`: set below
        for s in range(width, 0, -1):  # every path at once, one gather a step; filler where a path has ended
            if s in starts:
                cursor = np.where(step == s, row, cursor)
            ids.append(self.tokens[s][cursor])
            cursor = self.parents[s][cursor]
            if self.attention:
                att.append(self.attention[s - 1][cursor])
        ids_out = np.stack(ids[::-1], axis=1)  # (P, width + 1)
        att_out = np.stack(att[::-1], axis=1) if self.attention else None  # (P, width + 1, ..., Ls)
        last = np.flatnonzero(token >= 0)  # paths ended by max length output their last token too
        ids_out[last, step[last]] = token[last]
        for s in np.unique(step[last]).tolist() if att_out is not None else ():  # one step: the last
            at = last[step[last] == s]
            att_out[at, s] = self.attention[s][row[at]]
        return ids_out, step + (token >= 0), att_out

    def _filler(self, n: int) -> np.ndarray | None:
        """Zeros (n, ..., Ls) in the steps' attention dtype, or None when no attention was recorded."""
        if not self.attention:
            return None
        first = self.attention[0]
        return np.zeros((n,) + first.shape[1:], first.dtype)  # (P, ..., Ls)
