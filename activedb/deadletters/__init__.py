"""Dead letters: rows that could not be applied, kept exactly, for reading and replay.  Design note:
``README.md``.

Public names: :class:`Letter` (one to write), :class:`FinalReason` (a reason written as it is), :class:`LetterRecord` (one stored), :class:`LetterFilter`, :class:`ReasonKind` (a reason's kind),
:func:`insert`, :func:`insert_ahead` and :func:`written_ahead` (a letter written ahead of its batch), :func:`insert_in_flush` and :func:`insert_statement` (:class:`LettersInsert`: a flush's letters in statements of at most :data:`LETTERS_PER_STATEMENT` letters and :data:`STATEMENT_BYTES`, the store's bound of every statement's bytes), :func:`select`, :func:`count`, :func:`count_by_reason`, :func:`count_by_kind`, :func:`purge`, :class:`LetterReplayed`,
:func:`encode_original`, :func:`decode_original`, :data:`TABLE`, :data:`LETTER_BYTES` (the JSON a letter keeps: a larger one is kept
cut, :data:`CUT_PREVIEW_CHARS` of its readable form).
"""

from activedb.deadletters._letters import (
    CUT_PREVIEW_CHARS, LETTER_BYTES, LETTERS_PER_STATEMENT, TABLE, FinalReason, Letter, LetterFilter, LetterRecord, LetterReplayed, count, count_by_kind, count_by_reason, decode_original, encode_original,
    LettersInsert, ReasonKind, insert, insert_ahead, insert_in_flush, insert_statement, purge, select, written_ahead,
)
from activedb.store import STATEMENT_BYTES

__all__ = ["CUT_PREVIEW_CHARS", "LETTER_BYTES", "LETTERS_PER_STATEMENT", "STATEMENT_BYTES", "TABLE", "FinalReason", "Letter", "LetterFilter", "LetterRecord", "LetterReplayed", "count", "count_by_kind", "count_by_reason",
           "decode_original", "encode_original", "insert", "insert_ahead", "insert_in_flush", "insert_statement",
           "LettersInsert", "ReasonKind", "purge", "select", "written_ahead"]
