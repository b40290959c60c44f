"""The building blocks of the network: convolutions, the CSP blocks of YOLOv8 (C2f) and YOLO11/26 (C3k2, C3k),
the attention of YOLO11's C2PSA and YOLO26's last neck block, and SPPF. models/yolo.py puts them together.

Their attribute names (conv, bn, cv1, cv2, m, attn.qkv, ...) are Ultralytics' layer names, so the parameter names
of a model (its state_dict keys) are what utils/checkpoints/ultralytics.py maps their checkpoints onto: renaming
one breaks every saved checkpoint and the conversion.
"""

import torch
import torch.nn as nn


class Conv(nn.Module):
    """Conv2d + BatchNorm + SiLU. `fuse()` folds the BN into the conv for inference."""

    def __init__(self, c_in, c_out, k=1, s=1, groups=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))

    def fuse(self):
        # Folding is only valid with frozen statistics, i.e. eval mode
        # (pitfall M1: BatchNorm behaves differently in train and eval).
        self.conv = torch.nn.utils.fusion.fuse_conv_bn_eval(self.conv.eval(), self.bn.eval())
        self.bn = nn.Identity()


class Bottleneck(nn.Module):
    """Two 3x3 convs, with a residual connection when the shapes allow it."""

    def __init__(self, c_in, c_out, shortcut=True, expansion=1.0):
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 3)
        self.cv2 = Conv(hidden, c_out, 3)
        self.add = shortcut and c_in == c_out

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block: split, run n bottlenecks on one half, concatenate every intermediate output."""

    def __init__(self, c_in, c_out, n=1, shortcut=False, expansion=0.5):
        super().__init__()
        self.hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden, self.hidden, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class C3k(nn.Module):
    """CSP block with two branches: n bottlenecks after one 1x1 projection, the other projection kept as is."""

    def __init__(self, c_in, c_out, n=2, shortcut=True):
        super().__init__()
        hidden = c_out // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(c_in, hidden, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(C2f):
    """YOLO11's C2f: each inner block is a C3k (the deep variant) or a bottleneck of half width.
    attention (YOLO26's last neck block): each inner block is that bottleneck followed by a PSA block."""

    def __init__(self, c_in, c_out, n=1, deep=False, expansion=0.5, shortcut=True, attention=False):
        super().__init__(c_in, c_out, n, shortcut, expansion)
        h = self.hidden

        def inner():
            if attention:
                return nn.Sequential(Bottleneck(h, h, shortcut, expansion=0.5), PSABlock(h, max(h // 64, 1)))
            return C3k(h, h, 2, shortcut) if deep else Bottleneck(h, h, shortcut, expansion=0.5)

        self.m = nn.ModuleList(inner() for _ in range(n))


class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with 1x1 convs as projections and a
    depthwise 3x3 on the values as position encoding. Keys are half the width of values (YOLO11's attn_ratio)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.key_dim = self.head_dim // 2
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, groups=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = (
            self.qkv(x)
            .view(b, self.num_heads, 2 * self.key_dim + self.head_dim, h * w)
            .split((self.key_dim, self.key_dim, self.head_dim), 2)
        )
        attn = ((q * self.scale).transpose(-2, -1) @ k).softmax(-1)  # pixels x pixels, per head
        x = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(x)


class PSABlock(nn.Module):
    """Attention then a 1x1 feed-forward, each with a residual connection (a transformer block in convs)."""

    def __init__(self, c, num_heads):
        super().__init__()
        self.attn = Attention(c, num_heads)
        self.ffn = nn.Sequential(Conv(c, 2 * c, 1), Conv(2 * c, c, 1, act=False))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ffn(x)


class C2PSA(nn.Module):
    """YOLO11's attention stage after SPPF: split in two halves, n PSA blocks on one, concatenate."""

    def __init__(self, c, n=1):
        super().__init__()
        self.hidden = c // 2
        self.cv1 = Conv(c, 2 * self.hidden, 1)
        self.cv2 = Conv(2 * self.hidden, c, 1)
        self.m = nn.Sequential(*(PSABlock(self.hidden, max(self.hidden // 64, 1)) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.hidden, self.hidden), 1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools see 5, 9 and 13 pixel windows.
    residual (YOLO26): the first 1x1 conv is linear (no activation) and the input is added to the output."""

    def __init__(self, c_in, c_out, k=5, residual=False):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, act=not residual)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)
        self.residual = residual and c_in == c_out

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        y = self.cv2(torch.cat(y, 1))
        return x + y if self.residual else y
