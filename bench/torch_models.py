"""ResNet-18, SqueezeNet 1.1 and MobileNetV3-small as torchvision defines them, written from plain torch.nn
(torchvision is not needed, nothing is downloaded): the same layers, shapes and parameter names
(`layer1.0.conv1.weight`, `features.3.squeeze.bias`), random weights; and two transformers, a ViT-tiny
(timm's vit_tiny_patch16_224: 12 pre-LN blocks, width 192, 3 heads) and a 2-layer BERT-style encoder (post-LN,
width 256, 4 heads, sequence 128, the token embeddings given as the input), attention written out as
matmuls and softmax. Used by bench/bench_models.py."""
from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18: 11.7 M parameters (11.2 M after the exporter folds BatchNorm in)."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin = (64, 128, 256, 512), 64
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w)))
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    """torchvision.models.squeezenet1_1: 1.24 M parameters, 52 tensors."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: channels rounded to a multiple of 8, never 10% below v."""
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act=None) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(self.avgpool(x)))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, expanded: int, cout: int, se: bool, hs: bool, stride: int):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers = [_conv_bn(cin, expanded, 1, act=act)] if expanded != cin else []
        layers.append(_conv_bn(expanded, expanded, k, stride, groups=expanded, act=act))  # depthwise
        if se:
            layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
        layers.append(_conv_bn(expanded, cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3Small(nn.Module):
    """torchvision.models.mobilenet_v3_small: 2.54 M parameters (BatchNorm included)."""
    CONFIG = ((16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
              (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
              (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
              (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1))

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 16, 3, 2, act=nn.Hardswish),
                                      *(InvertedResidual(*c) for c in self.CONFIG),
                                      _conv_bn(96, 576, 1, act=nn.Hardswish))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    """A transformer block: pre-LN (ViT) or post-LN (BERT)."""

    def __init__(self, dim: int, heads: int, hidden: int, pre_norm: bool):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, hidden)
        self.pre_norm = pre_norm

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class ViTTiny(nn.Module):
    """timm's vit_tiny_patch16_224: 16x16 patches (196 + the class token), 12 blocks, 5.7 M parameters."""

    def __init__(self, size: int = 224, dim: int = 192, depth: int = 12, heads: int = 3, num_classes: int = 1000):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 16, 16)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (size // 16) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, 4 * dim, pre_norm=True) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class BertEncoder(nn.Module):
    """A 2-layer BERT-style encoder (post-LN, width 256, 4 heads, FFN 1024): position embeddings and the
    embedding LayerNorm, then the blocks, the pooler (tanh of a linear of the first token) and a 2-way head."""

    def __init__(self, seq: int = 128, dim: int = 256, depth: int = 2, heads: int = 4):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, seq, dim))
        self.embed_norm = nn.LayerNorm(dim)
        self.blocks = nn.Sequential(*(Block(dim, heads, 4 * dim, pre_norm=False) for _ in range(depth)))
        self.pooler = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        x = self.blocks(self.embed_norm(x + self.pos_embed))
        return self.head(torch.tanh(self.pooler(x[:, 0])))


MODELS = {"squeezenet1_1": SqueezeNet11, "resnet18": ResNet18, "mobilenet_v3_small": MobileNetV3Small,
          "vit_tiny": ViTTiny, "bert_2layer": BertEncoder}


def example_input(name: str, size: int = 224, seq: int = 128) -> torch.Tensor:
    """The model's one input, float64, seeded: an image 1x3xSxS in [0, 1), or BERT's 1 x seq x 256 token
    embeddings (normal)."""
    gen = torch.Generator().manual_seed(0)
    if name == "bert_2layer":
        return torch.randn(1, seq, 256, dtype=torch.float64, generator=gen)
    return torch.rand(1, 3, size, size, dtype=torch.float64, generator=gen)


def build(name: str, seed: int = 0, size: int = 224, seq: int = 128):
    """(model in eval mode, float64): random weights as torchvision (and timm, for the transformers)
    initialize them (activations keep their scale through the depth; SqueezeNet's conv biases zero, which
    the TorchScript exporter merges: the report's source_names), BatchNorm statistics and LayerNorm's
    affine parameters away from their defaults."""
    torch.manual_seed(seed)
    model = ViTTiny(size) if name == "vit_tiny" else BertEncoder(seq) if name == "bert_2layer" else MODELS[name]()
    with torch.no_grad():
        for p in (getattr(model, "cls_token", None), getattr(model, "pos_embed", None)):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        if name != "resnet18" and name != "squeezenet1_1":  # ResNet-18's fc keeps nn.Linear's own init
            for m in model.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02 if name in ("vit_tiny", "bert_2layer") else 0.01)
                    nn.init.zeros_(m.bias)
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        for m in convs:
            if name != "squeezenet1_1":
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            else:
                nn.init.kaiming_uniform_(m.weight) if m is not convs[-1] else nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                m.bias.zero_()
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval().double()
