"""GPT-2 BPE's round-trip report: does decode(encode(x)) give back x's bytes, on prose and on the awkward cases.

The files and the Encoding live in core.gpt2bpe (the serve job reads them too); their names are imported here for
the pretrain job's modules and tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import tiktoken

from scalelab.core.gpt2bpe import (
    ENCODER_JSON, EOT, EOT_TEXT, FILE_SHA256, GPT2_PATTERN, GPT2_VOCAB, VOCAB_BPE, TokenizerError,
    default_tokenizer_dir, gpt2_encoding, tokenizer_files, tokenizer_sha256,
)

__all__ = ["ENCODER_JSON", "EOT", "EOT_TEXT", "FILE_SHA256", "GPT2_PATTERN", "GPT2_VOCAB", "VOCAB_BPE",
           "TokenizerError", "default_tokenizer_dir", "gpt2_encoding", "tokenizer_files", "tokenizer_sha256",
           "ENGLISH_PAGE", "EDGE_CASES", "RoundTripCase", "RoundTripReport", "roundtrip_case", "roundtrip_report"]


# ---------------------------------------------------------------------------------------------
# round-trip report: does decode(encode(x)) give back x's bytes, on prose and on the awkward cases

ENGLISH_PAGE = """\
The river came down out of the hills in the spring, brown and loud, and for a few weeks every year the \
town remembered that it had been built on the river's terms and not its own. The mill wheel turned so \
fast that the miller stopped it at night for fear the axle would crack. Children were told to keep away \
from the bank, and so of course they went there every afternoon, to throw sticks into the current and \
count how long it took them to pass under the stone bridge.

By June the water had settled into its summer habits. It ran clear over the gravel bars, slow enough \
that you could see the shadows of fish holding still against it, and the old men who fished from the \
bridge said it was the best month of the year. Nobody argued with them. The meadows on either side were \
cut for hay, the carts went up and down the lane until dark, and the whole valley smelled of grass and \
dust and warm water.

It is easy, looking at a quiet river, to forget how much work it does. It carries the rain of a hundred \
square miles to the sea; it moves sand and stones a little at a time, year after year, until a bend \
becomes a loop and a loop becomes a lake cut off from the stream. The town's first map, drawn in 1784, \
shows the channel a quarter of a mile east of where it runs today. The church, which was built on the \
bank, now stands in a field, and the lane that led to the old ferry ends in a hedge.

In the autumn the leaves came down and rode the water like small boats, and the first frosts made the \
shallows smoke in the early mornings. The school took the older children to measure the depth at the \
bridge: 3.2 feet in September, 4.7 feet after the October storms. They wrote the numbers in a ledger \
that had been kept, with a few gaps, for more than sixty years. Reading it now, one can follow the wet \
years and the dry ones, the great flood of the winter when the bridge was closed for nine days, and the \
summer when the river nearly stopped altogether and the mill stood idle until the rains returned.

Winter was the season of waiting. Ice formed along the edges and sometimes, in a hard January, reached \
all the way across, so that the bolder boys could walk from one bank to the other. Their mothers did not \
approve. But the ice always broke in the end, with a noise like a gunshot that carried across the \
fields, and a few weeks later the water was brown and loud again, and the year began once more.
"""

EDGE_CASES: dict[str, str] = {
    "empty": "",
    "cjk": "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
    "combining_accents": "Cafe\u0301 (decomposed) vs Caf\u00e9 (composed); n\u0303, a\u0308\u0304, "
                         "Z\u0335\u0321a\u0336lgo",
    # Hebrew and Arabic with a right-to-left mark (U+200F) and left-to-right digits mixed in
    "rtl": "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u200f and "
           "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 (mixed 123 digits)",
    "emoji_zwj_skin_tones": "family \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466, coder "
                            "\U0001F469\U0001F3FD\u200d\U0001F4BB, flag \U0001F3F3\ufe0f\u200d\U0001F308, "
                            "thumbs \U0001F44D\U0001F3FF\U0001F44D\U0001F3FB",
    "tabs": "col1\tcol2\t\tcol3\n\tindented\t\n\t\t",
    "crlf": "line one\r\nline two\r\n\r\nline four\r\n",
    "runs_of_spaces": "a  b   c        d" + " " * 40 + "e",
    "trailing_whitespace": "ends with spaces and a tab   \t \n  \n",
    "control_chars": "nul\x00 bell\x07 escape\x1b[0m formfeed\x0c",
    "endoftext_as_text": f"before {EOT_TEXT} after {EOT_TEXT}",
}


@dataclass(frozen=True)
class RoundTripCase:
    name: str
    chars: int
    utf8_bytes: int
    tokens: int
    roundtrip_ok: bool  # decode_bytes(encode(x)) == x.encode("utf-8")
    has_eot_token: bool  # True would mean the literal "<|endoftext|>" text became the special token


@dataclass(frozen=True)
class RoundTripReport:
    encoding: str
    n_vocab: int
    english_bytes_per_token: float
    cases: tuple[RoundTripCase, ...]

    @property
    def all_ok(self) -> bool:
        return all(c.roundtrip_ok and not c.has_eot_token for c in self.cases)


def roundtrip_case(enc: tiktoken.Encoding, name: str, text: str) -> RoundTripCase:
    # disallowed_special=(): special-token text in data is ordinary text, never the document delimiter.
    tokens = enc.encode(text, allowed_special=set(), disallowed_special=())
    data = text.encode("utf-8")
    return RoundTripCase(name=name, chars=len(text), utf8_bytes=len(data), tokens=len(tokens),
                         roundtrip_ok=enc.decode_bytes(tokens) == data, has_eot_token=EOT in tokens)


def roundtrip_report(enc: tiktoken.Encoding) -> RoundTripReport:
    cases = (roundtrip_case(enc, "english_page", ENGLISH_PAGE),
             *(roundtrip_case(enc, name, text) for name, text in EDGE_CASES.items()))
    english = cases[0]
    return RoundTripReport(encoding=enc.name, n_vocab=enc.n_vocab, cases=cases,
                           english_bytes_per_token=round(english.utf8_bytes / english.tokens, 4))
