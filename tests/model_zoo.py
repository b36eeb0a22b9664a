"""Today's architectures, tiny, from plain torch.nn with random weights (nothing is downloaded;
torchvision and transformers are not needed): each builder returns (model in eval mode, float64, an
input). Shared by tests/onnx/test_model_zoo.py; sizes are kept to a few thousand weights so that each
model exports, imports and verifies in seconds."""
from __future__ import annotations

import torch
from torch import nn


def _seeded(build):
    def wrapped():
        torch.manual_seed(0)
        model, x = build()
        with torch.no_grad():  # trained-like weights: no two equal (exporters merge equal initializers)
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        for m in model.modules():  # BatchNorm in eval mode: non-trivial running statistics
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
        return model.eval().double(), x.double()
    wrapped.__name__ = build.__name__
    return wrapped


class ResidualBlock(nn.Module):
    """ResNet's basic block, then the classifier head."""

    def __init__(self, c=4):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c, 3)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.fc(self.pool(y).flatten(1))


class MobileNetV3Block(nn.Module):
    """An inverted residual with squeeze-and-excitation, HardSwish and HardSigmoid."""

    def __init__(self, c=4, e=8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e),
                                       nn.Hardswish())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, 2, 1), nn.ReLU(), nn.Conv2d(2, e, 1),
                                nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        y = self.project(y * self.se(y)) + x
        return self.head(y.mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self, cls, **kw):
        super().__init__()
        self.rnn, self.head = cls(3, 4, batch_first=True, **kw), nn.Linear(4 * (1 + kw.get("bidirectional", 0)), 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


class EncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer (is_causal given: the legacy exporter's tracer needs a bool there)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x, is_causal=False)


class TinyViT(nn.Module):
    """Patch embedding, class token, 2 pre-norm encoder layers with GELU, head on the class token."""

    def __init__(self, d=8):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 5, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 3)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1) + self.pos
        return self.head(self.norm(self.encoder(t))[:, 0])


class MLP(nn.Module):
    """Linear, LayerNorm, exact GELU, Linear."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.net(x)


@_seeded
def resnet_block():
    return ResidualBlock(), torch.randn(2, 4, 5, 5)


@_seeded
def mobilenetv3_block():
    return MobileNetV3Block(), torch.randn(1, 4, 5, 5)


@_seeded
def lstm():
    return Recurrent(nn.LSTM, bidirectional=True), torch.randn(2, 4, 3)


@_seeded
def gru():  # two layers: the second ONNX GRU node is torch's *_l1
    return Recurrent(nn.GRU, num_layers=2), torch.randn(2, 4, 3)


@_seeded
def rnn_tanh():
    return Recurrent(nn.RNN), torch.randn(2, 4, 3)


@_seeded
def transformer_encoder_layer():
    return EncoderLayer(), torch.randn(2, 3, 8)


@_seeded
def tiny_vit():
    return TinyViT(), torch.randn(1, 3, 8, 8)


@_seeded
def mlp_layernorm_gelu():
    return MLP(), torch.randn(3, 6)




class _ExactHardsigmoid(nn.Module):
    def forward(self, x):
        return torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)


def exact_reference(model):
    """A copy of the model whose gradients are torch's exactly: torch's Hardsigmoid backward multiplies
    by 1.0f/6.0f, a float32 constant, in float64 too (0.1666666716..., 3e-8 off), so the reference
    computes the same function as clamp(x / 6 + 1/2, 0, 1)."""
    import copy

    ref = copy.deepcopy(model)
    for name, m in list(ref.named_modules()):
        for child_name, child in list(m.named_children()):
            if isinstance(child, nn.Hardsigmoid):
                setattr(m, child_name, _ExactHardsigmoid())
    return ref


class CausalSelfAttention(nn.Module):
    """GPT-2's attention: one head, a causal mask built in forward (tril of ones, masked_fill with the
    float64 minimum), softmax, then the output projection."""

    def __init__(self, d=8):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        t, d = x.shape[1], x.shape[2]
        q, k, v = self.qkv(x).split(d, dim=2)
        scores = q @ k.transpose(1, 2) / d ** 0.5
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        return self.proj(torch.softmax(scores, -1) @ v)


@_seeded
def causal_attention():
    return CausalSelfAttention(), torch.randn(2, 4, 8)



class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class _Stack(nn.Module):
    """A ModuleList inside a named module: torch names `m.layers.0.norm.weight`."""

    def __init__(self, d):
        super().__init__()
        self.layers = nn.ModuleList([_Block(d), _Block(d)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class GroupNormStack(nn.Module):
    """Conv, GroupNorm (InstanceNormalization plus a scale and shift in ONNX), a PReLU per channel (its
    slope stored as (C, 1, 1)), then a ModuleList of pre-norm residual blocks inside the named module
    `m` on a rank-3 input (MatMul weights)."""

    def __init__(self, c=4, d=9):
        super().__init__()
        self.conv, self.gn, self.act = nn.Conv2d(2, c, 3, padding=1), nn.GroupNorm(2, c), nn.PReLU(c)
        self.m = _Stack(d)

    def forward(self, x):
        return self.m(self.act(self.gn(self.conv(x))).flatten(2))


@_seeded
def groupnorm_modulelist():
    return GroupNormStack(), torch.randn(2, 2, 3, 3)


def tiny_vit_merged():
    """TinyViT as initialized: nn.TransformerEncoder's layers are deep copies of one, so the exporters
    merge each pair of equal tensors into one, whose gradient is the sum of both layers'."""
    torch.manual_seed(0)
    return TinyViT().eval().double(), torch.randn(1, 3, 8, 8, dtype=torch.float64)


class TinyUNet(nn.Module):
    """A U-Net's two levels: conv, max-pool down, conv, nn.Upsample back (nearest, or bilinear with or
    without align_corners: each exports its own Resize modes), the skip concatenated, a last conv."""

    def __init__(self, mode="nearest", align_corners=None, c=3):
        super().__init__()
        self.down, self.mid = nn.Conv2d(2, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode=mode, align_corners=align_corners)
        self.out = nn.Conv2d(2 * c, 2, 1)

    def forward(self, x):
        skip = torch.tanh(self.down(x))
        deep = torch.tanh(self.mid(self.pool(skip)))
        return self.out(torch.cat([skip, self.up(deep)], dim=1))


@_seeded
def unet_nearest():
    return TinyUNet("nearest"), torch.randn(1, 2, 6, 6)


@_seeded
def unet_bilinear():
    return TinyUNet("bilinear", align_corners=False), torch.randn(1, 2, 6, 6)


@_seeded
def unet_bilinear_corners():
    return TinyUNet("bilinear", align_corners=True), torch.randn(1, 2, 6, 6)


class Top2MoE(nn.Module):
    """A top-2 mixture of experts over tokens: a router's softmax, torch.topk(2), the two weights
    renormalized, and the chosen experts' outputs gathered (torch.gather with topk's indices) and mixed."""

    def __init__(self, d=4, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.Linear(d, experts * d)  # every expert's d outputs, side by side
        self.d, self.n = d, experts

    def forward(self, x):
        probs = torch.softmax(self.router(x), dim=-1)  # (T, E)
        w, idx = probs.topk(2, dim=-1)  # (T, 2)
        w = w / w.sum(-1, keepdim=True)
        outs = self.experts(x).reshape(x.shape[0], self.n, self.d).transpose(1, 2)  # (T, d, E)
        chosen = outs.gather(2, idx.unsqueeze(1).expand(-1, self.d, -1))  # (T, d, 2)
        return (chosen * w.unsqueeze(1)).sum(-1)


@_seeded
def moe_top2():
    return Top2MoE(), torch.randn(5, 4)


ZOO = [resnet_block, mobilenetv3_block, lstm, gru, rnn_tanh, transformer_encoder_layer, tiny_vit, mlp_layernorm_gelu,
       groupnorm_modulelist, tiny_vit_merged, unet_nearest, unet_bilinear, unet_bilinear_corners, moe_top2]
