#!/usr/bin/env python3
"""Makes tests/fixtures/tiny-bert/: a tiny BERT saved by transformers' save_pretrained, a padded
batch of inputs, and what transformers computes for it (the parity fixture of `autokernel infer
--model DIR`, tests/infer_cli.rs and bert/tests/checkpoint.rs).

    pip install torch transformers   # only to regenerate the fixture
    scripts/make-bert-fixture.py [OUT_DIR]

Writes:
  config.json, model.safetensors  save_pretrained of a BertModel: 2 layers, hidden 64, 4 heads,
                                  FFN 128, vocab 100, 16 positions, hidden_act "gelu" (exact);
                                  weights stored as float16 (the fixture stays ~140 KB), and every
                                  weight is rounded to float16 *before* the reference runs, so the
                                  f32 computation below is exactly that of the stored weights
  inputs.json                     input_ids, token_type_ids, attention_mask of 4 right-padded
                                  sequences of lengths 11, 6, 1 and 9 (padded to 11)
  expected.safetensors            last_hidden_state [4, 11, 64], f32: transformers' forward in
                                  float32, eager attention, for every position (padded ones too)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tiny-bert")
os.makedirs(out, exist_ok=True)
torch.manual_seed(19)

config = BertConfig(
    vocab_size=100,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act="gelu",
    max_position_embeddings=16,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    attn_implementation="eager",
)
model = BertModel(config, add_pooling_layer=False).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "LayerNorm.weight" in name:
            p.copy_(1 + 0.1 * torch.randn_like(p))
        elif name.endswith("bias") or "LayerNorm" in name:
            p.copy_(0.1 * torch.randn_like(p))
        else:
            # Wider than BERT's 0.02, so attention is far from uniform and every path matters.
            p.copy_(0.15 * torch.randn_like(p))
        p.copy_(p.half().float())

lengths = [11, 6, 1, 9]
seq = max(lengths)
ids = torch.zeros(len(lengths), seq, dtype=torch.long)
types = torch.zeros_like(ids)
mask = torch.zeros_like(ids)
for i, n in enumerate(lengths):
    ids[i, :n] = torch.randint(1, config.vocab_size, (n,))
    types[i, n // 2:n] = 1  # a second segment
    mask[i, :n] = 1

with torch.no_grad():
    hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

model.half().save_pretrained(out)
with open(os.path.join(out, "inputs.json"), "w") as f:
    json.dump({"input_ids": ids.tolist(), "token_type_ids": types.tolist(),
               "attention_mask": mask.tolist()}, f)
    f.write("\n")
save_file({"last_hidden_state": hidden.float().contiguous()},
          os.path.join(out, "expected.safetensors"))
print(f"wrote {out}: batch {len(lengths)}, lengths {lengths}, "
      f"|last_hidden_state| max {hidden.abs().max().item():.3f}")
