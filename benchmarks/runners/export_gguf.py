"""Convert the benchmark checkpoint to GGUF with llama.cpp's own converter, then quantize.

Run by compare.py inside the llamacpp venv:
    python export_gguf.py HF_DIR OUT_DIR {f32,q8_0,q4_0} THREADS SOURCE_CACHE

F32 is written by llama.cpp's convert_hf_to_gguf.py; Q8_0 and Q4_0 are made from that F32 file
by llama.cpp's quantizer (llama_model_quantize, what the llama-quantize tool calls). The
converter and gguf-py are not in the llama-cpp-python wheel, only in its sdist: they are taken
from the sdist of the installed version (pip download, cached in SOURCE_CACHE), so the converter
and the runtime are the same llama.cpp.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import llama_cpp

CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
QUANT_TYPES = {
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
}
MODEL_FILE = "model.gguf"


def converter_dir(cache: Path) -> Path:
    """The converter files of the installed llama-cpp-python's sdist, extracted once."""
    version = importlib.metadata.version("llama-cpp-python")
    target = cache / f"llama-cpp-python-{version}"
    if (target / "convert_hf_to_gguf.py").exists():
        return target
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--progress-bar", "off", "-d", download, f"llama-cpp-python=={version}"],
            check=True, stdout=sys.stderr)
        (sdist,) = Path(download).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                # llama_cpp_python-X/vendor/llama.cpp/<part...>
                _, _, rest = member.name.partition("/vendor/llama.cpp/")
                if rest.startswith(CONVERTER_PARTS) and member.isfile():
                    member.name = rest
                    tar.extract(member, target, filter="data")
    return target


def wordlevel_merges(tokens: list[str]) -> list[str]:
    """BPE merges that rebuild every word of a word-level vocabulary from its characters.

    llama.cpp has no word-level tokenizer; its "whitespace" one splits on whitespace and runs
    BPE inside each word, and it refuses a GGUF without merges. These merges (shorter results
    first, each word built left to right) make it tokenize the checkpoint's words exactly as
    the WordLevel tokenizer does. The benchmark feeds ids, so this only keeps the GGUF honest."""
    merges = {}
    for token in tokens:
        if token.startswith(("<", "[")) or len(token) < 2:
            continue
        for end in range(2, len(token) + 1):
            merges[token[:end]] = f"{token[:end - 1]} {token[end - 1]}"
    return [merges[word] for word in sorted(merges, key=lambda word: (len(word), word))]


def install_wordlevel_vocab(convert: Any) -> None:
    """The checkpoint's tokenizer is a WordLevel one over whitespace-split words (build_model.py),
    which the converter's Llama path (sentencepiece, then BPE with a known pre-tokenizer hash)
    rejects. Write it as llama.cpp's "whitespace" tokenizer: same tokens and ids, same specials."""
    gguf = convert.gguf
    from conversion.llama import LlamaModel

    def set_vocab(self: Any) -> None:
        tokenizer = json.loads((self.dir_model / "tokenizer.json").read_text())
        if tokenizer["model"]["type"] != "WordLevel":
            raise SystemExit("export_gguf.py only knows the benchmark's WordLevel tokenizer")
        self.get_vocab_base_pre = lambda _tokenizer: "whitespace"
        tokens, toktypes, _ = self.get_vocab_base()
        self.gguf_writer.add_tokenizer_model("whitespace")
        self.gguf_writer.add_tokenizer_pre("whitespace")
        self.gguf_writer.add_token_list(tokens)
        self.gguf_writer.add_token_types(toktypes)
        self.gguf_writer.add_token_merges(wordlevel_merges(tokens))
        gguf.SpecialVocab(self.dir_model, load_merges=False).add_to_gguf(self.gguf_writer)

    LlamaModel.set_vocab = set_vocab


def convert_f32(hf_dir: Path, out_file: Path, cache: Path) -> None:
    source = converter_dir(cache)
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import convert_hf_to_gguf as convert

    install_wordlevel_vocab(convert)
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outtype", "f32",
                "--outfile", str(out_file)]
    convert.main()


def quantize(f32_file: Path, out_file: Path, quant: str, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(
        str(f32_file).encode(), str(out_file).encode(), params)
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed with status {status}")


def main() -> None:
    hf_dir, out_dir, quant, threads, cache = sys.argv[1:6]
    if quant != "f32" and quant not in QUANT_TYPES:
        raise SystemExit(f"unknown GGUF type {quant!r}: f32, " + ", ".join(QUANT_TYPES))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f32_file = out / (MODEL_FILE if quant == "f32" else "model-f32.gguf")
    convert_f32(Path(hf_dir), f32_file, Path(cache))
    if quant != "f32":
        quantize(f32_file, out / MODEL_FILE, quant, int(threads))
        f32_file.unlink()  # only the quantized model is measured; 0.5 GB less per export
    (out / "gguf-export.json").write_text(json.dumps({
        "gguf_type": quant.upper(),
        "llama_cpp_python": llama_cpp.__version__,
    }))


if __name__ == "__main__":
    main()
