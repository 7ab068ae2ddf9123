"""The nine models of the HyperSack paper's search spaces, built with random weights.

Image models take 3x32x32 inputs and give 10 logits (the CIFAR-10 variants: a 3x3
stem with no early down-sampling for the CNNs, 4x4 patches for the transformers).
Text models take token ids (N, L), padding id 0, and give 2 logits. Parameter counts
match the published models within a few per cent (`tests/unit/test_zoo.py`):

- shufflenet: ShuffleNetV2 1x, stages of width 116, 232, 464 with 4, 8, 4 blocks; 1.26 M
- mobilenet_v2: MobileNetV2 1x, inverted residuals, stride-1 stem; 2.24 M
- vit_tiny: ViT, 12 layers, width 192, 3 heads, MLP 768, 4x4 patches; 5.36 M
- deit_tiny: as vit_tiny, plus a distillation token and head; 5.36 M
- resnet18, resnet34: basic blocks (2, 2, 2, 2) and (3, 4, 6, 3), widths 64..512;
  11.2 M and 21.3 M
- bert_tiny: BERT, 2 layers, width 128, 2 heads, vocabulary 30,522; 4.39 M
- pythia_14m, pythia_31m: GPT-NeoX, 6 layers, width 128 and 256, 4 and 8 heads, rotary
  positions on a quarter of each head, attention and MLP in parallel, separate input
  and output embeddings (vocabulary 50,304); 14.1 M and 30.5 M

The Pythia models keep their language-model head: a review is classified by the
next-token logits after it, restricted to two label tokens, so every parameter of the
published model is trained.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hypersack.core.errors import InvalidInput

BERT_VOCAB = 30_522
PYTHIA_VOCAB = 50_304
LABEL_TOKENS = (PYTHIA_VOCAB - 2, PYTHIA_VOCAB - 1)  # "negative", "positive" for Pythia
ROTARY_PCT = 0.25  # GPT-NeoX rotates a quarter of each attention head


# ------------------------------------------------------------------ CNNs
class _Shuffle(nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        return x.view(n, self.groups, c // self.groups, h, w).transpose(1, 2).reshape(n, c, h, w)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class _ShuffleBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = cout // 2
        if stride == 2:
            self.left = nn.Sequential(_conv_bn(cin, cin, 3, 2, groups=cin, relu=False),
                                      _conv_bn(cin, branch, 1))
            right_in = cin
        else:
            self.left = nn.Sequential()
            right_in = branch
        self.right = nn.Sequential(_conv_bn(right_in, branch, 1),
                                   _conv_bn(branch, branch, 3, stride, groups=branch, relu=False),
                                   _conv_bn(branch, branch, 1))
        self.shuffle = _Shuffle(2)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.right(b)], dim=1)
        else:
            out = torch.cat([self.left(x), self.right(x)], dim=1)
        return self.shuffle(out)


class _PooledCNN(nn.Module):
    """A CNN body (`features`), global average pooling, and a linear `head`."""

    features: nn.Sequential
    head: nn.Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ShuffleNetV2(_PooledCNN):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        widths, repeats = (116, 232, 464), (4, 8, 4)
        layers: list[nn.Module] = [_conv_bn(3, 24, 3)]
        cin = 24
        for w, r in zip(widths, repeats, strict=True):
            layers += [_ShuffleBlock(cin, w, 2)] + [_ShuffleBlock(w, w, 1) for _ in range(r - 1)]
            cin = w
        layers.append(_conv_bn(cin, 1024, 1))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(1024, classes)


class _Inverted(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(cin, mid, 1))
        layers += [_conv_bn(mid, mid, 3, stride, groups=mid), _conv_bn(mid, cout, 1, relu=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return x + out if self.residual else out


class MobileNetV2(_PooledCNN):
    # (expansion, channels, blocks, stride); strides of the first two stages are 1 for 32x32
    CFG = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3)]
        cin = 32
        for t, c, n, s in self.CFG:
            for i in range(n):
                layers.append(_Inverted(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(1280, classes)


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride),
                                  _conv_bn(cout, cout, 3, relu=False))
        self.short = (nn.Sequential() if stride == 1 and cin == cout
                      else _conv_bn(cin, cout, 1, stride, relu=False))

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.short(x))


class ResNet(_PooledCNN):
    def __init__(self, blocks: tuple[int, int, int, int], classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 64, 3)]
        cin = 64
        for i, (w, n) in enumerate(zip((64, 128, 256, 512), blocks, strict=True)):
            for j in range(n):
                layers.append(_Basic(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)


# ------------------------------------------------------------------ vision transformers
class ViT(nn.Module):
    def __init__(self, classes: int = 10, width: int = 192, depth: int = 12, heads: int = 3,
                 patch: int = 4, image: int = 32, distilled: bool = False) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, patch)
        self.tokens = 2 if distilled else 1
        self.cls = nn.Parameter(torch.zeros(1, self.tokens, width))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + self.tokens, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)
        # DeiT: a second head on the distillation token; with no teacher both heads
        # learn the labels and their logits are averaged.
        self.head_dist = nn.Linear(width, classes) if distilled else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        out = self.head(x[:, 0])
        if self.head_dist is not None:
            out = (out + self.head_dist(x[:, 1])) / 2
        return out


# ------------------------------------------------------------------ text models
class BertTiny(nn.Module):
    def __init__(self, classes: int = 2, vocab: int = BERT_VOCAB, width: int = 128,
                 depth: int = 2, heads: int = 2, max_len: int = 512) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Embedding(max_len, width)
        self.types = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1,
                                           activation="gelu", batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.pooler = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: Tensor) -> Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.words(ids) + self.positions(pos)[None] + self.types.weight[0]
        x = self.blocks(self.norm(x), src_key_padding_mask=ids == 0)
        return self.head(torch.tanh(self.pooler(x[:, 0])))


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class _NeoXBlock(nn.Module):
    def __init__(self, width: int, heads: int, rotary_pct: float = ROTARY_PCT) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.rot = int(self.head_dim * rotary_pct)
        self.ln_attn = nn.LayerNorm(width)
        self.ln_mlp = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        n, length, width = x.shape
        q, k, v = (self.qkv(self.ln_attn(x)).view(n, length, self.heads, 3 * self.head_dim)
                   .transpose(1, 2).chunk(3, dim=-1))
        r = self.rot
        q = torch.cat([_rotate(q[..., :r], cos, sin), q[..., r:]], dim=-1)
        k = torch.cat([_rotate(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = self.out(att.transpose(1, 2).reshape(n, length, width))
        return x + att + self.mlp(self.ln_mlp(x))  # parallel residual, as in GPT-NeoX


class Pythia(nn.Module):
    def __init__(self, width: int, heads: int, depth: int = 6, vocab: int = PYTHIA_VOCAB) -> None:
        super().__init__()
        self.embed_in = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_NeoXBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.embed_out = nn.Linear(width, vocab, bias=False)
        rot = int(width // heads * ROTARY_PCT)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, rot, 2).float() / rot),
                             persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        """Two logits: the next-token logits of the two label tokens after the review."""
        length = ids.shape[1]
        t = torch.arange(length, device=ids.device).float()
        freqs = torch.outer(t, self.inv_freq)  # type: ignore[arg-type]
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos()[None, None], angles.sin()[None, None]
        x = self.embed_in(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        last = ((ids != 0).sum(dim=1) - 1).clamp(min=0)  # the last real token (right padding)
        h = self.norm(x[torch.arange(ids.shape[0], device=ids.device), last])
        logits = self.embed_out(h)  # the full vocabulary, as in language modelling
        return logits[:, list(LABEL_TOKENS)]


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "shufflenet": ShuffleNetV2,
    "mobilenet_v2": MobileNetV2,
    "vit_tiny": ViT,
    "deit_tiny": lambda: ViT(distilled=True),
    "resnet18": lambda: ResNet((2, 2, 2, 2)),
    "resnet34": lambda: ResNet((3, 4, 6, 3)),
    "bert_tiny": BertTiny,
    "pythia_14m": lambda: Pythia(128, 4),
    "pythia_31m": lambda: Pythia(256, 8),
}
VOCAB = {"bert_tiny": BERT_VOCAB, "pythia_14m": PYTHIA_VOCAB, "pythia_31m": PYTHIA_VOCAB}


def build(name: str) -> nn.Module:
    if name not in BUILDERS:
        raise InvalidInput(f"no zoo model {name!r}; valid: {', '.join(sorted(BUILDERS))}")
    return BUILDERS[name]()


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def init_scale(model: nn.Module) -> None:
    """Transformer-style initialisation for linear layers and embeddings (std 0.02)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) and not isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
