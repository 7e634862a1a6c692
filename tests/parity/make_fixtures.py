#!/usr/bin/python3
"""Builds the parity reference models in plain PyTorch and writes fixtures.

For every model in MODELS this writes, under tests/parity/fixtures/:

  <model>.weights.safetensors   parameters, named as ebb names them
  <model>.input.safetensors     the input, named like the spec's input ("x")
  <model>.expected.safetensors  PyTorch's output, named like the spec's output ("y")

tests/test_parity.c runs specs/parity/<model>.yaml (or, for a model in
SPEC_OF, the spec of specs/ that the weights' __metadata__ names, with its
params) on the input with those weights and compares with the expected output.

Run with Debian's python3-torch (the interpreter matters: a pyenv python
usually has no torch):

    /usr/bin/python3 tests/parity/make_fixtures.py

Everything is seeded, so rerunning rewrites the same bytes on the same
PyTorch build. The safetensors writer is written here so that the
`safetensors` package is not needed.

The three fixture scripts share two options (tests/parity/check_fixtures.py
uses them to check the committed fixtures against another torch):

    --out DIR     write into DIR instead of fixtures/
    --replay DIR  take the inputs, weights and targets from the fixtures in DIR
                  (by name, same shapes and dtypes) instead of drawing them
                  from the seeded generators, so that only the outputs,
                  losses, gradients and optimizer results are computed here
"""

import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
REPLAY = None  # --replay DIR: the fixtures whose inputs and weights replace the seeded ones

_DTYPES = {torch.float32: ("F32", "<f4"), torch.float64: ("F64", "<f8"), torch.int64: ("I64", "<i8")}


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as safetensors: an 8-byte little-endian header
    length, a JSON header {name: {dtype, shape, data_offsets}} (with
    __metadata__: "format" and the given strings) and the raw little-endian
    data, tensors in name order."""
    header, blobs, offset = {"__metadata__": {"format": "pt", **(metadata or {})}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        code, npdt = _DTYPES[t.dtype]
        data = t.numpy().astype(npdt, copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


_TORCH = {code: (dt, npdt) for dt, (code, npdt) in _DTYPES.items()}


def load_safetensors(path):
    """The tensors of a safetensors file written by save_safetensors, as
    {name: tensor}, and its __metadata__."""
    import numpy as np

    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, h in header.items():
        dt, npdt = _TORCH[h["dtype"]]
        lo, hi = h["data_offsets"]
        a = np.frombuffer(blob[8 + n + lo : 8 + n + hi], dtype=npdt).reshape(h["shape"])
        tensors[name] = torch.from_numpy(a.copy()).to(dt)
    return tensors, meta


def replayed(fname, tensors):
    """{name: tensor} as drawn from the seeds; with --replay DIR, the tensors
    of the same names in DIR/fname instead, which must have the same shapes
    and dtypes."""
    if REPLAY is None:
        return tensors
    path = os.path.join(REPLAY, fname)
    saved, _ = load_safetensors(path)
    out = {}
    for name, t in tensors.items():
        if name not in saved:
            sys.exit(f"--replay: {path} has no tensor '{name}'")
        s = saved[name]
        if s.dtype != t.dtype or s.shape != t.shape:
            sys.exit(f"--replay: {path}: '{name}' is {s.dtype} {list(s.shape)}, "
                     f"the script makes {t.dtype} {list(t.shape)}")
        out[name] = s
    return out


def randomize_(module, gen_scale=0.5):
    """Gives every norm weight and every zero-initialised bias non-trivial
    values, so that a parity test would notice a swapped or ignored one."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(_owner(module, name), (nn.LayerNorm, nn.BatchNorm2d)):
                if leaf == "weight":
                    p.uniform_(0.5, 1.5)
                else:
                    p.uniform_(-gen_scale, gen_scale)
            elif leaf in ("in_proj_bias", "bias") and torch.count_nonzero(p) == 0:
                p.uniform_(-0.1, 0.1)


def _owner(module, name):
    for part in name.split(".")[:-1]:
        module = getattr(module, part)
    return module


def state(module):
    """The state_dict as ebb names it: PyTorch's own names, num_batches_tracked
    included (an int64 buffer in both)."""
    return dict(module.state_dict())


# ---- the reference models ---------------------------------------------------
# Each is an nn.Module whose state_dict keys are the ebb parameter names of
# specs/parity/<model>.yaml.


class MLP(nn.Module):
    def __init__(self, features=24, hidden=48, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=-1)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + self.norm(F.gelu(self.fc(x)))


class ResidualTower(nn.Module):
    def __init__(self, d=32, depth=4, classes=8):
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class FFN(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Gate8(nn.Module):
    def __init__(self, d=16, hidden=32, experts=8, classes=6):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(FFN(d, hidden) for _ in range(experts))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.embed(x)
        w = F.softmax(self.router(x), dim=-1)
        out = None
        for i, e in enumerate(self.experts):
            term = w[:, i : i + 1] * e(x)
            out = term if out is None else out + term
        return self.head(out)


class ConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 12, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(12)
        self.fc = nn.Linear(12 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer(d, heads, ff, dropout=0, activation=gelu,
    batch_first=True, norm_first=False), written out; its state_dict keys are
    the same as the library layer's."""

    def __init__(self, d=32, heads=4, ff=64):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.linear1 = nn.Linear(d, ff)
        self.linear2 = nn.Linear(ff, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        x = self.norm1(x + self.self_attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.linear2(F.gelu(self.linear1(x))))


def transformer_stack():
    """PyTorch's own nn.TransformerEncoder of 4 such layers: its state_dict
    keys (layers.0.self_attn.in_proj_weight, ...) are what the spec's
    `repeat` names its copies with "layers.{i}"."""
    layer = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=False
    )
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)


class GRULoop(nn.Module):
    def __init__(self, features=12, hidden=16, steps=6, classes=5):
        super().__init__()
        self.steps = steps
        self.encode = nn.Linear(features, hidden)
        self.cell = nn.GRUCell(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.encode(x)
        for _ in range(self.steps):
            h = self.cell(x, h)
        return self.head(h)


class SwitchRouted(nn.Module):
    def __init__(self, d=16, hidden=32, classes=6):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.selector = nn.Linear(d, 3)
        self.branches = nn.ModuleList(
            [
                nn.ModuleDict({"fc": nn.Linear(d, d)}),
                nn.ModuleDict({"fc1": nn.Linear(d, hidden), "fc2": nn.Linear(hidden, d)}),
                nn.ModuleDict(),
            ]
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)
        self.last_route = None

    def branch(self, i, x):
        b = self.branches[i]
        if i == 0:
            return F.relu(b["fc"](x))
        if i == 1:
            return b["fc2"](F.gelu(b["fc1"](x)))
        return torch.tanh(x)

    def forward(self, x):
        x = self.embed(x)
        scores = self.selector(x)
        route = scores.argmax(dim=1)
        self.last_route, self.last_scores = route, scores
        out = torch.empty_like(x)
        for i in range(3):
            rows = (route == i).nonzero().flatten()
            if rows.numel():
                out[rows] = self.branch(i, x[rows])  # only the rows that chose it
        return self.head(self.norm(out))


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock: relu(x' + bn2(conv2(relu(bn1(conv1(x)))))),
    x' the identity, or downsample(x) where the block changes the shape."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18(num_classes=classes), written out with the
    same module names, so its state_dict has torchvision's keys (conv1.weight,
    layer2.0.downsample.1.running_var, fc.bias, ...; 122 of them) and, at
    planes=64, torchvision's shapes. `planes` is the first stage's width (64
    in torchvision); the fixture is made at RESNET18_SIZE to keep its weights
    small (11.7M parameters at 64 with 1000 classes, 45K at 4 with 10).
    Initialised as torchvision does: kaiming_normal_(fan_out, relu) for the
    convolutions, batch norms at 1 and 0 (randomize_ and build() move them),
    the classifier as nn.Linear."""

    def __init__(self, planes=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, planes, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths = [planes, 2 * planes, 4 * planes, 8 * planes]
        inplanes = planes
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            blocks = nn.Sequential(BasicBlock(inplanes, w, stride), BasicBlock(w, w))
            setattr(self, f"layer{i + 1}", blocks)
            inplanes = w
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * planes, classes)
        for mod in self.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(mod, nn.BatchNorm2d):
                nn.init.constant_(mod.weight, 1)
                nn.init.constant_(mod.bias, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# torchvision's resnet18().state_dict() keys, in its order, at any width
def torchvision_resnet18_keys():
    bn = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    keys = ["conv1.weight"] + [f"bn1.{k}" for k in bn]
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}.{block}."
            keys += [p + "conv1.weight"] + [p + "bn1." + k for k in bn]
            keys += [p + "conv2.weight"] + [p + "bn2." + k for k in bn]
            if layer > 1 and block == 0:
                keys += [p + "downsample.0.weight"] + [p + "downsample.1." + k for k in bn]
    return keys + ["fc.weight", "fc.bias"]


# specs/resnet18.yaml's params for the fixture (its -p values)
RESNET18_SIZE = dict(planes=4, classes=10)

# name -> (constructor, input shape, seed)
MODELS = {
    "mlp": (MLP, (8, 24), 1),
    "residual_tower": (ResidualTower, (8, 32), 2),
    "gate8": (Gate8, (8, 16), 3),
    "conv_net": (ConvNet, (4, 3, 16, 16), 4),
    "transformer_encoder": (Encoder, (2, 5, 32), 5),
    "transformer_stack": (transformer_stack, (2, 5, 32), 8),
    "gru_loop": (GRULoop, (6, 12), 6),
    "switch_routed": (SwitchRouted, (16, 16), 7),
    # maps 24, 12, 12, 6, 3 and 2. Training batch norms make its gradients
    # ill-conditioned in float32 (make_grad_fixtures.py): 4e-6 to 2e-5 from
    # float64, by seed and shape, where the other models are at 1e-7 to 1e-6.
    # Batch 4 at 48x48 with this seed is at 4.2e-6, the best of those tried.
    "resnet18": (lambda: ResNet18(**RESNET18_SIZE), (4, 3, 48, 48), 11),
}

# models whose spec is not specs/parity/<name>.yaml: the spec (relative to
# the source tree) and the params it is loaded with (`ebb plan -p`), written
# into the weights' __metadata__ as "spec" and "params"
SPEC_OF = {
    "resnet18": ("specs/resnet18.yaml", ",".join(f"{k}={v}" for k, v in RESNET18_SIZE.items())),
}


def build(name):
    ctor, shape, seed = MODELS[name]
    torch.manual_seed(seed)
    m = ctor()
    randomize_(m)
    if name in ("conv_net", "resnet18"):  # running statistics that differ from (0, 1)
        with torch.no_grad():
            for bn in (mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
    m.eval()
    x = torch.randn(*shape)
    return m, x


def check_reference(name, m, x, y):
    """Cross-checks a written-out model against PyTorch's own layer, and
    prints what the test needs to know about the input."""
    if name == "transformer_encoder":
        layer = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=False
        )
        layer.load_state_dict(m.state_dict())
        layer.eval()
        err = (layer(x) - y).abs().max().item()
        print(f"  nn.TransformerEncoderLayer agrees within {err:.2e}")
        assert err < 1e-5
    if name == "switch_routed":
        route = m.last_route.tolist()
        counts = [route.count(i) for i in range(3)]
        top2 = m.last_scores.topk(2, dim=1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        print(f"  routing {route} -> rows per branch {counts}, smallest argmax margin {margin:.3g}")
        assert sum(c > 0 for c in counts) >= 2, "the input must reach at least two branches"
        assert margin > 1e-3, "an argmax near a tie could flip under rounding"
    if name == "resnet18":
        keys = list(m.state_dict())
        assert keys == torchvision_resnet18_keys(), "not torchvision's state_dict keys"
        print(f"  torchvision's {len(keys)} state_dict keys, in its order")


def parse_args(argv):
    """[--out DIR] [--replay DIR] [NAME ...] -> (out, names): the folder to
    write into (default fixtures/ next to this script) and the fixtures to
    make (empty: all). Sets REPLAY. The three fixture scripts share it."""
    global REPLAY
    args, opts = list(argv), {"--out": os.path.join(HERE, "fixtures"), "--replay": None}
    for opt in opts:
        if opt in args:
            i = args.index(opt)
            if i + 1 >= len(args):
                sys.exit(f"{opt} needs a folder")
            opts[opt] = os.path.abspath(args[i + 1])
            del args[i : i + 2]
    REPLAY = opts["--replay"]
    return opts["--out"], args


def main():
    global OUT
    OUT, names = parse_args(sys.argv[1:])
    os.makedirs(OUT, exist_ok=True)
    names = names or list(MODELS)
    for name in names:
        m, x = build(name)
        if REPLAY:
            m.load_state_dict(replayed(f"{name}.weights.safetensors", state(m)))
            x = replayed(f"{name}.input.safetensors", {"x": x})["x"]
        with torch.no_grad():
            y = m(x)
            check_reference(name, m, x, y)
            # how far float32 itself is from float64, for scale
            y64 = m.double()(x.double())
            m.float()
        floor = ((y.double() - y64).abs().max() / y64.abs().max()).item()
        sd = state(m)
        meta = dict(zip(("spec", "params"), SPEC_OF[name])) if name in SPEC_OF else None
        save_safetensors(os.path.join(OUT, f"{name}.weights.safetensors"), sd, meta)
        save_safetensors(os.path.join(OUT, f"{name}.input.safetensors"), {"x": x})
        save_safetensors(os.path.join(OUT, f"{name}.expected.safetensors"), {"y": y})
        n = sum(v.numel() for v in sd.values())
        print(f"{name}: x {list(x.shape)} -> y {list(y.shape)}, {len(sd)} tensors ({n} values), "
              f"float32 vs float64 rel. error {floor:.2e}")


if __name__ == "__main__":
    main()
