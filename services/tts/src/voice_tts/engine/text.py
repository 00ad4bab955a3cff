"""Text for streaming: UTF-8 pieces in, *stable* text-token ids out.

The official wrapper tokenizes `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>
assistant\\n` in one go with the Qwen2 tokenizer. Special tokens are split off first, so
the segment `assistant\\n{text}` is tokenized on its own: role = [im_start] + its first
two ids, text ids = the rest. We tokenize the same segment incrementally.

Stability rule. The Qwen2 tokenizer is NFC normalization, a regex pre-tokenizer (no
lookbehind, at most one character of lookahead) and byte-level BPE inside each
pre-token. Appending text can only change the *last* pre-token (it may grow, split or
merge with what follows); every earlier pre-token and its BPE ids are final. So we
commit the ids of all pre-tokens but the last, and keep the last one (and any
incomplete UTF-8 sequence) as an uncommitted tail until more text or flush. As a guard
the committed ids are checked to be a prefix of the ids of the whole pending text.

Each committed id keeps how many characters of the text, as pushed (before NFC), it ends
at (`committed_chars`, from the tokenizer's offsets): what the talker has read once it
has taken that id (`chars_read`, reported with the audio: `AudioPacket.text_chars`).

Differences from the official processor, on purpose: special-token strings inside the
text (e.g. a literal "<|im_end|>") stay plain text instead of becoming control tokens.

The tokenizer comes from the checkpoint's `tokenizer.json`, or `vocab.json` +
`merges.txt` assembled into the Qwen2 pipeline with the `tokenizers` library.
"""

from __future__ import annotations

import codecs
import json
import threading
from pathlib import Path
from typing import NamedTuple

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .length_guard import TextLength

# The Qwen2 pre-tokenizer pattern (transformers' Qwen2Tokenizer / tokenizer.json).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ROLE_PREFIX = "assistant\n"
# Ids of the role that lead every utterance's stream: [im_start, "assistant", "\n"].
ROLE_LEN = 3


def build_qwen2_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def load_text_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if (path / "vocab.json").exists() and (path / "merges.txt").exists():
        vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        merges = []
        for line in (path / "merges.txt").read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#version"):
                a, b = line.split(" ")
                merges.append((a, b))
        return build_qwen2_tokenizer(vocab, merges)
    if (path / "tokenizer.json").exists():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    raise FileNotFoundError(f"no text tokenizer (vocab.json + merges.txt or tokenizer.json) "
                            f"in {path}")


class TextTokenizer:
    """The plain-text side of the Qwen2 tokenizer plus the model's special ids."""

    def __init__(self, tok: Tokenizer, im_start: int, im_end: int) -> None:
        self.tok, self.im_start, self.im_end = tok, im_start, im_end
        self._split = pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated")
        self._nfc = normalizers.NFC()
        self.newline_ids = self.encode("\n")
        role = self.encode(ROLE_PREFIX)
        if len(role) != ROLE_LEN - 1:
            raise ValueError(f"tokenizer encodes {ROLE_PREFIX!r} as {len(role)} ids; the "
                             f"official prompt layout needs exactly {ROLE_LEN - 1}")
        self.role_ids = [im_start, *role]
        # <|im_end|>\n<|im_start|>assistant\n
        self.suffix_ids = [im_end, *self.newline_ids, im_start, *role]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids if text else []

    def encode_ends(self, text: str) -> tuple[list[int], list[int]]:
        """`encode(text)` and, per id, the character offset in `text` where it ends."""
        if not text:
            return [], []
        enc = self.tok.encode(text, add_special_tokens=False)
        return enc.ids, [end for _, end in enc.offsets]

    def normalize(self, text: str) -> str:
        return self._nfc.normalize_str(text)

    def pre_token_starts(self, text: str) -> list[int]:
        """Start offsets of the pre-tokens of (normalized) `text`."""
        return [start for _, (start, _end) in self._split.pre_tokenize_str(text)]

    def assistant_ids(self, text: str) -> list[int]:
        """The official full prompt ids of `text` (for tests and the offline path)."""
        return [self.im_start, *self.encode(ROLE_PREFIX + text), *self.suffix_ids]

    def ref_ids(self, ref_text: str) -> list[int]:
        """A reference transcript's ids as the official in-context prompt takes them:
        `<|im_start|>assistant\\n{ref_text}<|im_end|>\\n` minus the role and the end."""
        return self.encode(ROLE_PREFIX + ref_text)[ROLE_LEN - 1:]

    def ref_prompt_ids(self, ref_text: str) -> list[int]:
        """The official full reference prompt ids (for tests)."""
        return [self.im_start, *self.encode(ROLE_PREFIX + ref_text), self.im_end,
                *self.newline_ids]

    def instruct_ids(self, instruct: str) -> list[int]:
        """<|im_start|>user\\n{instruct}<|im_end|>\\n"""
        return [self.im_start, *self.encode("user\n" + instruct), self.im_end,
                *self.newline_ids]


class TextIds(NamedTuple):
    """An utterance's committed ids, split where the prompt layout splits them."""

    role: list[int]  # [im_start, "assistant", "\n"] (ROLE_LEN ids)
    text: list[int]  # the text's ids committed so far
    finished: bool  # flushed: no more text will come


class TextStream:
    """Incremental, thread-safe tokenization of one utterance.

    `push` takes str or bytes (bytes may split a UTF-8 character anywhere); `committed`
    grows with ids that can no longer change. `finish()` commits the tail. The ids start
    with the ROLE_LEN role ids ([im_start, "assistant", "\\n"]), then the text ids: read
    them split with `ids()`.
    """

    def __init__(self, tokenizer: TextTokenizer, max_chars: int) -> None:
        self.tokenizer, self.max_chars = tokenizer, max_chars
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._lock = threading.Lock()
        self._tail = ROLE_PREFIX  # uncommitted, normalized, starts at a pre-token boundary
        self._raw_tail = ROLE_PREFIX  # the same text as pushed (NFC(_raw_tail) == _tail)
        self._raw_done = -len(ROLE_PREFIX)  # text characters before _raw_tail
        self.committed: list[int] = [tokenizer.im_start]
        # Per committed id: characters of the text (as pushed) up to its end (role: 0).
        # Appended under the lock with `committed`; the engine thread reads it unlocked
        # (it only grows, and only past the ids the engine has seen).
        self.committed_chars: list[int] = [0]
        self.chars = 0
        self.length = TextLength()  # what the length guard counts
        self.has_content = False  # any non-whitespace character so far
        self.finished = False

    def push(self, piece: str | bytes) -> int:
        """Append a piece; returns how many ids became committed. Raises ValueError."""
        with self._lock:
            if self.finished:
                raise ValueError("utterance already flushed")
            saved = self._decoder.getstate()
            if isinstance(piece, bytes | bytearray | memoryview):
                try:
                    text = self._decoder.decode(bytes(piece))
                except UnicodeDecodeError as e:
                    self._decoder.setstate(saved)
                    raise ValueError(f"text is not valid UTF-8: {e.reason} at byte "
                                     f"{e.start} of the piece") from None
            elif isinstance(piece, str):
                if self._decoder.getstate()[0]:
                    raise ValueError("str piece after an incomplete UTF-8 byte sequence")
                try:
                    piece.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("text contains lone surrogates (not valid UTF-8)") from None
                text = piece
            else:
                raise ValueError(f"text piece must be str or bytes, got {type(piece).__name__}")
            if self.chars + len(text) > self.max_chars:
                self._decoder.setstate(saved)
                raise ValueError(f"utterance text over the limit of {self.max_chars} characters")
            self.chars += len(text)
            self.length.add(text)
            self.has_content = self.has_content or (not text.isspace() and bool(text))
            self._tail = self.tokenizer.normalize(self._tail + text)
            self._raw_tail += text
            return self._commit(final=False)

    def finish(self) -> int:
        with self._lock:
            if self.finished:
                return 0
            try:
                rest = self._decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise ValueError("text ends inside a UTF-8 character") from None
            self._tail = self.tokenizer.normalize(self._tail + rest)
            self._raw_tail += rest
            self.finished = True
            return self._commit(final=True)

    def _commit(self, final: bool) -> int:
        if final:
            ids, ends = self.tokenizer.encode_ends(self._tail)
            self._keep(ids, ends, self._tail, len(self._raw_tail))
            self._tail = self._raw_tail = ""
            return len(ids)
        starts = self.tokenizer.pre_token_starts(self._tail)
        if len(starts) < 2:
            return 0
        cut = starts[-1]
        part = self._tail[:cut]
        ids, ends = self.tokenizer.encode_ends(part)
        if self.tokenizer.encode(self._tail)[: len(ids)] != ids:
            return 0  # not provably stable yet; wait for more text
        raw = self._raw_len(part)
        self._keep(ids, ends, part, raw)
        self._tail = self._tail[cut:]
        self._raw_tail = self._raw_tail[raw:]
        return len(ids)

    def _raw_len(self, part: str) -> int:
        """Characters of `_raw_tail` (as pushed) whose NFC is `part`, a prefix of `_tail`."""
        raw = self._raw_tail
        if raw.startswith(part):
            return len(part)  # pushed in NFC already: the usual case
        for n in range(len(raw) + 1):  # NFC changed it (rare): find the matching prefix
            if self.tokenizer.normalize(raw[:n]) == part:
                return n
        return max(0, len(raw) - (len(self._tail) - len(part)))

    def _keep(self, ids: list[int], ends: list[int], part: str, raw: int) -> None:
        """Commit `ids` (of normalized `part`, `raw` characters as pushed), each with the
        text characters up to its end (offsets scaled to the pushed text if NFC changed
        its length; the role prefix counts 0)."""
        base, n, top = self._raw_done, len(part), 0
        for end in ends:
            top = max(top, end if raw == n else end * raw // max(1, n))
            self.committed_chars.append(max(0, base + top))
        self.committed.extend(ids)
        self._raw_done = base + raw

    def chars_read(self, n: int) -> int:
        """Characters of the text (as pushed) behind its first `n` text ids; past the last
        id of a finished text, all of it. Engine thread, no lock (see `committed_chars`)."""
        if n <= 0:
            return 0
        cc = self.committed_chars
        if ROLE_LEN + n <= len(cc):
            return cc[ROLE_LEN + n - 1]
        return self.chars if self.finished else cc[-1]

    def ids(self) -> TextIds:
        """The committed ids now (a consistent copy: other threads may push meanwhile)."""
        with self._lock:
            return TextIds(self.committed[:ROLE_LEN], self.committed[ROLE_LEN:],
                           self.finished)
