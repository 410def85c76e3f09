"""GPT-2 BPE built offline: exact ids, the split regex, file checks, and byte-exact round trips."""
from __future__ import annotations

import hashlib
import shutil

import pytest
from tiktoken_ext.openai_public import r50k_pat_str

from scalelab.pretrain.tokenizer import (EDGE_CASES, EOT, FILE_SHA256, GPT2_PATTERN, TokenizerError,
                                         default_tokenizer_dir, gpt2_encoding, roundtrip_report, tokenizer_sha256)

# sha256 of "encoder.json <sha>\nvocab.bpe <sha>\n" with the two pinned file hashes.
TOKENIZER_SHA = "9f08c598c09a1e9ab7ac8d97c46e958d388a71b7838bde18cdf6c69c26cd773a"


@pytest.fixture(scope="module")
def enc():
    return gpt2_encoding()


def test_reference_vector(enc):
    assert enc.encode("Hello world, this is a test.") == [15496, 995, 11, 428, 318, 257, 1332, 13]
    assert enc.name == "gpt2" and enc.n_vocab == 50257 and enc.eot_token == EOT == 50256


def test_split_pattern_is_tiktokens_gpt2():
    assert GPT2_PATTERN == r50k_pat_str


@pytest.mark.parametrize("text, pieces", [
    ("a  b", [b"a", b" ", b" b"]),  # a space run leaves its last space to the next word
    ("a\tb\r\nc", [b"a", b"\t", b"b", b"\r", b"\n", b"c"]),
    ("x   \n", [b"x", b" ", b" ", b" ", b"\n"]),
    ("Caf\u00e9", [b"C", b"af", b"\xc3\xa9"]),
    ("Cafe\u0301", [b"C", b"afe", b"\xcc", b"\x81"]),  # the combining accent is split into its bytes
    ("\U0001F44D\U0001F3FF", [b"\xf0\x9f\x91", b"\x8d", b"\xf0\x9f", b"\x8f", b"\xbf"]),
])
def test_byte_level_pieces(enc, text, pieces):
    assert [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(text)] == pieces


def test_endoftext_is_text_unless_allowed(enc):
    assert enc.encode("<|endoftext|>", disallowed_special=()) == [27, 91, 437, 1659, 5239, 91, 29]
    assert enc.encode_ordinary("<|endoftext|>") == [27, 91, 437, 1659, 5239, 91, 29]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]
    with pytest.raises(ValueError, match="disallowed special token"):
        enc.encode("<|endoftext|>")


def test_tokenizer_sha256_is_over_both_files():
    lines = "".join(f"{name} {FILE_SHA256[name]}\n" for name in ("encoder.json", "vocab.bpe"))
    assert hashlib.sha256(lines.encode()).hexdigest() == TOKENIZER_SHA
    assert tokenizer_sha256() == TOKENIZER_SHA


def test_shared_tokenizer_files_match_package(shared_data):
    folder = shared_data / "gpt2_tokenizer"
    for name in ("encoder.json", "vocab.bpe"):
        assert (folder / name).read_bytes() == (default_tokenizer_dir() / name).read_bytes()
    assert tokenizer_sha256(folder) == TOKENIZER_SHA
    text = "Shared files, same ids: ünïcödé 漢字 🙂"
    assert gpt2_encoding(folder).encode_ordinary(text) == gpt2_encoding().encode_ordinary(text)


def test_missing_file_names_folder(tmp_path):
    shutil.copy(default_tokenizer_dir() / "vocab.bpe", tmp_path / "vocab.bpe")
    with pytest.raises(TokenizerError, match=f"tokenizer folder {tmp_path}: encoder.json not found"):
        gpt2_encoding(tmp_path)


def test_foreign_bpe_file_is_refused(tmp_path):
    shutil.copy(default_tokenizer_dir() / "encoder.json", tmp_path / "encoder.json")
    vocab = (default_tokenizer_dir() / "vocab.bpe").read_bytes()
    (tmp_path / "vocab.bpe").write_bytes(vocab[:-20])
    with pytest.raises(TokenizerError, match=f"{tmp_path / 'vocab.bpe'}: sha256 [0-9a-f]{{64}} is not GPT-2's"):
        tokenizer_sha256(tmp_path)


def test_roundtrip_report(enc):
    report = roundtrip_report(enc)
    cases = {c.name: c for c in report.cases}
    assert list(cases) == ["english_page", *EDGE_CASES]
    assert report.all_ok
    assert all(c.roundtrip_ok and not c.has_eot_token for c in report.cases)
    assert (cases["empty"].tokens, cases["empty"].utf8_bytes) == (0, 0)
    assert (cases["english_page"].chars, cases["english_page"].tokens) == (2410, 545)
    assert report.english_bytes_per_token == round(2410 / 545, 4)
    # 4 emoji sequences, each several 4-byte code points joined by 3-byte ZWJs: bytes > chars
    assert cases["emoji_zwj_skin_tones"].utf8_bytes == 101
    # "before", " after", and twice the 7 pieces ' <' '|' 'end' 'of' 'text' '|' '>' of the literal
    assert cases["endoftext_as_text"].tokens == 16


def test_gutenberg_book_round_trips(enc, shared_data):
    data = (shared_data / "corpora" / "gutenberg_nltk" / "carroll-alice.txt").read_bytes()
    tokens = enc.encode_ordinary(data.decode("utf-8"))
    assert enc.decode_bytes(tokens) == data
    assert len(data) == 150526 and len(tokens) == 38468  # 3.91 bytes/token: 19th-century prose with line breaks
    assert EOT not in tokens
