"""A tiny llama-architecture GGUF model, made on the spot: random weights, real llama.cpp code.

Nothing may be downloaded, so the tests that run llama.cpp's server write their own model
with `gguf`, llama.cpp's own writer. The output is gibberish; what matters is that real
llama.cpp code tokenizes, prefills, samples and streams it: real token timing, SSE framing,
usage and the server's one slot.

- Vocabulary: SentencePiece-style ("llama" tokenizer): `<unk>`, `<s>`, `</s>`, the 256
  byte-fallback tokens `<0x00>`..`<0xFF>`, then `▁` (the space) and printable ASCII, one
  character a token, so one prompt character is one prompt token.
- Weights: seeded normal noise (reproducible: same seed, same file, same tokens). The output
  rows of the control and byte tokens are zero, so greedy decoding only ever picks a
  printable character: no end-of-sequence, generation runs until `max_tokens`
  (`finish_reason` "length"), and each streamed chunk is one character of valid UTF-8.
- A chat template (`tokenizer.chat_template`), which llama-cpp-python's server picks up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPACE = "\u2581"
PRINTABLE = [chr(c) for c in range(33, 127)]


@dataclass(frozen=True)
class Shape:
    """Sizes of the model: small enough to write in a second, big enough that a token
    costs llama.cpp measurable work on one thread."""

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 768
    context_length: int = 4096


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf.TokenType values) of the tiny SPM vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [SPACE, *PRINTABLE]
    types = [2, 3, 3] + [6] * 256 + [1] * (1 + len(PRINTABLE))
    scores = [0.0] * 259 + [-float(i) for i in range(1 + len(PRINTABLE))]
    return tokens, scores, types


def write_model(path: Path, seed: int = 0, shape: Shape = Shape()) -> Path:
    """Write the model to `path` (a few MB of F32); the same seed writes the same weights."""
    # Imported here: only the llama.cpp tests need them (the `llamacpp` extra brings both),
    # and a tier that never writes a model must not need them to be collected.
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab, d, head_dim = len(tokens), shape.n_embd, shape.n_embd // shape.n_head
    d_kv = head_dim * shape.n_head_kv

    def noise(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("sidestream-tiny")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(d)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (rows, columns) = ggml's ne reversed: (out, in) for a projection.
    output = noise(n_vocab, d)
    output[:259] = 0.0  # control and byte tokens are never the greedy choice
    writer.add_tensor("token_embd.weight", noise(n_vocab, d))
    for n in range(shape.n_layer):
        writer.add_tensor(f"blk.{n}.attn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(f"blk.{n}.attn_q.weight", noise(d, d))
        writer.add_tensor(f"blk.{n}.attn_k.weight", noise(d_kv, d))
        writer.add_tensor(f"blk.{n}.attn_v.weight", noise(d_kv, d))
        writer.add_tensor(f"blk.{n}.attn_output.weight", noise(d, d))
        writer.add_tensor(f"blk.{n}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(f"blk.{n}.ffn_gate.weight", noise(shape.n_ff, d))
        writer.add_tensor(f"blk.{n}.ffn_up.weight", noise(shape.n_ff, d))
        writer.add_tensor(f"blk.{n}.ffn_down.weight", noise(d, shape.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
