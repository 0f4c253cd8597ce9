"""The model against independent references with copied weights.

Post-norm (the paper): `torch.nn.TransformerEncoderLayer` / `TransformerDecoderLayer` with `norm_first=False`.
Pre-norm (`normalize_before=True`): a reference written here from the Annotated Transformer's layout,
`x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm on the encoder and decoder stacks.
Both references compute embeddings as `Embedding(x) * sqrt(d_model) + PE` with the §3.5 formula written out here.
"""

import math

import pytest
import torch
from helpers import batch, tiny_config
from torch import nn

from vaswani import VaswaniForConditionalGeneration, shift_tokens_right


def positional_encoding(length: int, d_model: int) -> torch.Tensor:
    pe = torch.zeros(length, d_model)
    for pos in range(length):
        for i in range(0, d_model, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / d_model))
            if i + 1 < d_model:
                pe[pos, i + 1] = math.cos(pos / 10000 ** (i / d_model))
    return pe


def embed(model, ids):
    d = model.config.d_model
    return model.model.shared(ids) * math.sqrt(d) + positional_encoding(ids.shape[1], d)


def copy_attention(ours, theirs: nn.MultiheadAttention):
    theirs.in_proj_weight.data.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    if ours.q_proj.bias is not None:
        theirs.in_proj_bias.data.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.bias.data.copy_(ours.out_proj.bias)
    else:
        theirs.in_proj_bias.data.zero_()
        theirs.out_proj.bias.data.zero_()
    theirs.out_proj.weight.data.copy_(ours.out_proj.weight)


def copy_norm(ours, theirs):
    theirs.load_state_dict(ours.state_dict())


def torch_reference_logits(model, input_ids, attention_mask, decoder_input_ids):
    c = model.config
    enc_layers, dec_layers = [], []
    for ours in model.model.encoder.layers:
        ref = nn.TransformerEncoderLayer(
            c.d_model,
            c.encoder_attention_heads,
            c.encoder_ffn_dim,
            dropout=0.0,
            batch_first=True,
            layer_norm_eps=c.layer_norm_eps,
            norm_first=False,
        )
        copy_attention(ours.self_attn, ref.self_attn)
        ref.linear1.load_state_dict(ours.fc1.state_dict())
        ref.linear2.load_state_dict(ours.fc2.state_dict())
        copy_norm(ours.self_attn_layer_norm, ref.norm1)
        copy_norm(ours.final_layer_norm, ref.norm2)
        enc_layers.append(ref.eval())
    for ours in model.model.decoder.layers:
        ref = nn.TransformerDecoderLayer(
            c.d_model,
            c.decoder_attention_heads,
            c.decoder_ffn_dim,
            dropout=0.0,
            batch_first=True,
            layer_norm_eps=c.layer_norm_eps,
            norm_first=False,
        )
        copy_attention(ours.self_attn, ref.self_attn)
        copy_attention(ours.encoder_attn, ref.multihead_attn)
        ref.linear1.load_state_dict(ours.fc1.state_dict())
        ref.linear2.load_state_dict(ours.fc2.state_dict())
        copy_norm(ours.self_attn_layer_norm, ref.norm1)
        copy_norm(ours.encoder_attn_layer_norm, ref.norm2)
        copy_norm(ours.final_layer_norm, ref.norm3)
        dec_layers.append(ref.eval())
    pad = attention_mask == 0
    memory = embed(model, input_ids)
    for layer in enc_layers:
        memory = layer(memory, src_key_padding_mask=pad)
    T = decoder_input_ids.shape[1]
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = embed(model, decoder_input_ids)
    for layer in dec_layers:
        x = layer(x, memory, tgt_mask=causal, memory_key_padding_mask=pad)
    return x @ model.model.shared.weight.T


@pytest.mark.parametrize("attention_bias", [False, True])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_post_norm_model_equals_torch_nn_transformer_layers(attention_bias, attn):
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(
        tiny_config(attention_bias=attention_bias, attn_implementation=attn)
    ).eval()
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec).logits
    with torch.no_grad():
        ref = torch_reference_logits(model, input_ids, attention_mask, dec)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


# ---- pre-norm: the Annotated Transformer's layout, written out with plain tensor operations ----------------------
def attention(q_in, kv_in, attn, mask):
    """softmax(QK^T / sqrt(d_k)) V with h heads; mask (B, 1 or Tq, Tk) True = attend."""
    h = attn.num_heads
    B, Tq, d = q_in.shape
    Tk = kv_in.shape[1]
    q = attn.q_proj(q_in).view(B, Tq, h, d // h).transpose(1, 2)
    k = attn.k_proj(kv_in).view(B, Tk, h, d // h).transpose(1, 2)
    v = attn.v_proj(kv_in).view(B, Tk, h, d // h).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, Tq, d)
    return attn.out_proj(out)


def ffn(layer, x):
    return layer.fc2(torch.relu(layer.fc1(x)))


def seed_prenorm_logits(model, input_ids, attention_mask, decoder_input_ids):
    src_mask = attention_mask.bool()[:, None, :]  # (B, 1, S)
    T = decoder_input_ids.shape[1]
    tgt_mask = torch.tril(torch.ones(T, T, dtype=torch.bool))[None]  # (1, T, T)
    x = embed(model, input_ids)
    for layer in model.model.encoder.layers:
        n = layer.self_attn_layer_norm(x)
        x = x + attention(n, n, layer.self_attn, src_mask)
        x = x + ffn(layer, layer.final_layer_norm(x))
    memory = model.model.encoder.layer_norm(x)
    y = embed(model, decoder_input_ids)
    for layer in model.model.decoder.layers:
        n = layer.self_attn_layer_norm(y)
        y = y + attention(n, n, layer.self_attn, tgt_mask)
        y = y + attention(layer.encoder_attn_layer_norm(y), memory, layer.encoder_attn, src_mask)
        y = y + ffn(layer, layer.final_layer_norm(y))
    y = model.model.decoder.layer_norm(y)
    return y @ model.model.shared.weight.T


def test_pre_norm_option_equals_the_seed_documents_layout():
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(tiny_config(normalize_before=True)).eval()
    # Non-trivial LayerNorm parameters so that a misplaced norm cannot pass.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec).logits
    with torch.no_grad():
        ref = seed_prenorm_logits(model, input_ids, attention_mask, dec)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    # And the post-norm default is a different function of the same weights.
    post = VaswaniForConditionalGeneration(tiny_config(normalize_before=False)).eval()
    post.load_state_dict(model.state_dict(), strict=False)
    other = post(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec).logits
    assert not torch.allclose(other, ours, atol=1e-3)
