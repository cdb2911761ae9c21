"""Pre-tokenization regexes: the text is cut into pieces with one of these before BPE merges run."""

from __future__ import annotations

from tokenizers import Regex

from smelt.errors import UserError

# GPT-4 (cl100k_base): case-insensitive contractions, words with one leading non-letter, digits in
# groups of at most three, punctuation runs, newlines, and whitespace kept off the following word.
GPT4_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GPT-2: contractions, words, numbers and punctuation runs each with an optional leading space.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

NAMED_PATTERNS = {"gpt4": GPT4_PATTERN, "gpt2": GPT2_PATTERN}


def resolve_pattern(pattern: str) -> str:
    """The regex for `tokenizer.pattern`: a named pattern (`gpt4`, `gpt2`) or a regex of its own."""
    regex = NAMED_PATTERNS.get(pattern, pattern)
    if not regex:
        raise UserError(
            "tokenizer.pattern is empty. Set it to `gpt4` (the default), `gpt2` or a pre-tokenization regex."
        )
    compile_pattern(regex)
    return regex


def compile_pattern(regex: str) -> Regex:
    try:
        return Regex(regex)
    except Exception as exc:  # tokenizers raises a bare Exception for Oniguruma errors
        raise UserError(
            f"tokenizer.pattern = {regex!r} is not a valid regex ({exc}). Use `gpt4`, `gpt2` or a valid "
            f"Oniguruma regex (\\p{{L}} letters, \\p{{N}} digits, (?!...) lookahead are supported)."
        ) from exc
