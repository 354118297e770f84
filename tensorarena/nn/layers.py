"""Layers with torch.nn names, parameter layouts and default initialisation."""

from __future__ import annotations

import math

import numpy as np

from .. import autograd
from ..ops import where
from ..ops._base import new
from ..tape import host
from ..tensor import Tensor
from . import functional as F
from . import init
from .containers import ModuleList
from .module import Module, _check_name
from .parameter import Parameter


def _size(owner: str, name: str, value) -> int:
    """`value` as a non-negative int, or a TypeError/ValueError naming the layer and the argument.

    bool is refused although it is an int: Linear(True, 3) is a typo, not a size of 1.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{owner}: {name} must be non-negative, got {value}")
    return int(value)


def normalized_shape_of(owner: str, value) -> tuple[int, ...]:
    """A norm layer's normalized_shape: one size or a sequence of them, as a tuple (a float or another
    wrong type is named as such, not met as "object is not iterable")."""
    sizes = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(_size(owner, "normalized_shape", n) for n in sizes)


def _empty_param(shape: tuple[int, ...], dtype) -> Parameter:
    return Parameter.empty(shape, dtype)  # deferred (no memory, fills recorded) under nn.deferred_init()


class Linear(Module):
    """y = x W^T + b. Shape: (..., in_features) -> (..., out_features); weight is (out, in) as in torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator | None = None, dtype=np.float32) -> None:
        super().__init__()
        in_features, out_features = _size("Linear", "in_features", in_features), _size("Linear", "out_features", out_features)
        self.in_features = in_features
        self.out_features = out_features
        self.weight = _empty_param((out_features, in_features), dtype)
        self.register_parameter("bias", _empty_param((out_features,), dtype) if bias else None)  # a slot even if None
        self.reset_parameters(rng=rng)

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """torch's default: kaiming_uniform(a=sqrt(5)), i.e. U(+-1/sqrt(in)) for weight and bias alike."""
        rng = init.get_generator(rng)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            init.uniform_(self.bias, -bound, bound, rng=rng)

    def forward(self, x) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table of `num_embeddings` vectors. Shape: integer (...) -> (..., embedding_dim)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, *,
                 rng: np.random.Generator | None = None, dtype=np.float32) -> None:
        super().__init__()
        num_embeddings = _size("Embedding", "num_embeddings", num_embeddings)
        embedding_dim = _size("Embedding", "embedding_dim", embedding_dim)
        if padding_idx is not None:
            # bool is an int, but padding_idx=True is a mistake, not row 1
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)):
                raise TypeError(f"Embedding: padding_idx must be an integer row index or None, got {padding_idx!r}")
            padding_idx = int(padding_idx)
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} is outside [-{num_embeddings}, {num_embeddings})")
            padding_idx %= num_embeddings  # torch stores it non-negative
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.weight = _empty_param((num_embeddings, embedding_dim), dtype)
        self.reset_parameters(rng=rng)

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: int | None = None) -> "Embedding":
        """An Embedding holding a copy of `embeddings` (rows, dim): frozen (no gradient) unless freeze=False, and the
        padding row kept as given (padding_idx only stops its gradient), as torch's. Unlike torch's, which shares the
        tensor's memory, a later write to `embeddings` does not reach the layer."""
        table = embeddings.data if isinstance(embeddings, Tensor) else np.asarray(embeddings)
        if isinstance(embeddings, (list, tuple)) and table.dtype == np.float64:
            # NumPy reads Python floats as float64; torch.tensor (what a torch script passes) makes float32
            table = table.astype(np.float32)
        if table.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D (num_embeddings, embedding_dim), "
                             f"got shape {table.shape}")
        if table.dtype.kind != "f":
            raise TypeError(f"Embedding.from_pretrained: embeddings must be floating point, got dtype {table.dtype}")
        # A generator of its own for the throw-away initialisation: loading weights draws nothing from the
        # default one, as in torch, so the random numbers after it are the same with or without this call.
        embedding = cls(*table.shape, padding_idx, rng=np.random.default_rng(0), dtype=table.dtype)
        embedding.weight.data[...] = table
        embedding.weight.requires_grad = not freeze
        return embedding

    def reset_parameters(self, *, rng: np.random.Generator | None = None) -> None:
        """N(0, 1), padding row zero (torch's default)."""
        init.normal_(self.weight, 0.0, 1.0, rng=rng)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    def forward(self, indices) -> Tensor:
        out = F.embedding(indices, self.weight)
        if self.padding_idx is not None and self.weight.requires_grad and autograd.is_grad_enabled():
            # torch never updates the padding row: send no gradient to the positions that
            # read it. where(mask, out, out.detach()) leaves the forward values unchanged.
            idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
            keep = new(idx.shape + (1,), np.bool_)  # in the arena, written by a recorded call: a captured
            host(np.not_equal, idx, self.padding_idx, out=keep[..., 0])  # fused step recomputes it per batch
            out = where(keep, out, out.detach())
        return out

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """Normalise over the trailing `normalized_shape` dims, then scale by weight and shift by bias."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, *,
                 bias: bool = True, dtype=np.float32) -> None:
        super().__init__()
        self.normalized_shape = normalized_shape_of("LayerNorm", normalized_shape)
        # A negative or NaN eps makes every output NaN (sqrt of a negative variance); inf makes it 0.
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)) \
                or not 0.0 <= eps < math.inf:
            raise ValueError(f"LayerNorm: eps must be a finite number >= 0, got {eps!r}")
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        # Registered even when None: slots that take only a Parameter, as torch's
        self.register_parameter("weight", init.ones_(_empty_param(self.normalized_shape, dtype))
                                if elementwise_affine else None)
        self.register_parameter("bias", init.zeros_(_empty_param(self.normalized_shape, dtype))
                                if elementwise_affine and bias else None)

    def forward(self, x) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        # torch's: bias shows too, else LayerNorm(3, bias=False) reads as LayerNorm(3)
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class Dropout(Module):
    """Inverted dropout while training, identity in eval mode; randomness from `rng` (or the default).
    `inplace` is accepted as torch's and changes nothing computed (see the activations below)."""

    def __init__(self, p: float = 0.5, inplace: bool = False, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise TypeError(f"Dropout: dropout probability must be a real number in [0, 1], got {p!r}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p, self.inplace = float(p), inplace
        self.rng = rng

    def forward(self, x) -> Tensor:
        # rng=None is resolved per call, so a later init.manual_seed() takes effect.
        return F.dropout(x, self.p, training=self.training, rng=init.get_generator(self.rng))

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class GELU(Module):
    """GELU activation; approximate='none' (erf) or 'tanh'."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    """max(x, 0); `inplace` as torch's, see the activations below."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

    def forward(self, x) -> Tensor:
        return F.relu(x)


class Tanh(Module):
    """Hyperbolic tangent."""

    def forward(self, x) -> Tensor:
        return F.tanh(x)


class Identity(Module):
    """Returns its input; accepts and ignores constructor arguments, as torch's does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x):
        return x


class Sequential(ModuleList):
    """Modules applied in order; children named '0', '1', ... as torch.nn.Sequential, or by the keys of one dict
    (Sequential(OrderedDict([("fc", Linear(...)), ...])): state_dict keys "fc.weight", as torch's). As torch's, an
    appended module is named by its position, and an insert, `del seq[i]` or a pop renames all by position, while
    a slice and `del seq.fc` (delattr) keep the names the entries had."""

    _walk_skip = ("_items", "_names")

    def __init__(self, *modules: Module) -> None:
        names = None
        if len(modules) == 1 and isinstance(modules[0], dict):
            for key in modules[0]:
                _check_name(key, "Sequential key")
            names, modules = list(modules[0]), tuple(modules[0].values())
        super().__init__(modules)
        object.__setattr__(self, "_names", names)

    def _own_children(self):
        names = vars(self).get("_names")
        if names is None:
            yield from super()._own_children()
            return
        yield from zip(names, self._items)
        yield from Module._own_children(self)

    def _entry_index(self, name: str) -> int | None:
        """A named Sequential's entries go by their keys (setattr(seq, "fc", new) replaces "fc"), others by position."""
        names = vars(self).get("_names")
        if names is None:
            return super()._entry_index(name)
        return names.index(name) if name in names else None

    def _entry_names(self) -> list[str]:
        """Each entry's name, in order: its key, or its position."""
        names = vars(self).get("_names")
        return list(names) if names is not None else [str(i) for i in range(len(self._items))]

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            # The entries keep their names, as torch's slice (built from its _modules' items): seq[1:] of
            # (Linear, ReLU, Linear) has keys '1', '2', so a checkpoint of torch's slice loads into ours.
            return Sequential(dict(zip(self._entry_names()[idx], self._items[idx])))
        return super().__getitem__(idx)

    def __delattr__(self, name: str) -> None:
        index = self._entry_index(name)
        if index is None or index == len(self._items):
            super().__delattr__(name)
            return
        # torch's `del seq.fc` (Module.__delattr__) removes that entry alone: the others keep their names ('out'
        # stays 'out', and del seq.1 leaves '0', '2'); only `del seq[i]` renames all by position.
        names = self._entry_names()
        del names[index], self._items[index]
        object.__setattr__(self, "_names", names)

    def append(self, module: Module) -> "Sequential":
        names = vars(self).get("_names")
        name = str(len(self._items))
        if names is not None and name in names:
            # torch's append is add_module(str(len(seq)), module): after `del seq.1` ('0', '2') that name is taken,
            # and torch replaces the entry under it (two entries of one name would share a state_dict key).
            self[names.index(name)] = module
            return self
        super().append(module)
        if names is not None:
            names.append(name)
        return self

    def insert(self, index: int, module: Module) -> "Sequential":
        """Insert one module before `index`; returns the Sequential (torch's does), all named by position."""
        super().insert(index, module)
        object.__setattr__(self, "_names", None)
        return self

    def __delitem__(self, idx) -> None:
        super().__delitem__(idx)
        object.__setattr__(self, "_names", None)

    def pop(self, idx: int = -1) -> Module:
        module = super().pop(idx)
        object.__setattr__(self, "_names", None)
        return module

    def _from_list(self, items: list) -> "Sequential":
        return Sequential(*items)

    def __mul__(self, times: int) -> "Sequential":
        """A new Sequential of this one's modules `times` over (the same modules, shared, as torch's), named by
        position."""
        if not isinstance(times, int):
            return NotImplemented
        if times <= 0:
            raise ValueError(f"Non-positive multiplication factor {times} for Sequential: repeating the modules "
                             f"needs a count of 1 or more")
        return self._from_list(self._items * times)

    __rmul__ = __mul__

    def __imul__(self, times: int) -> "Sequential":
        """This Sequential's modules `times` over, in place (appended by position, as torch's)."""
        repeated = self.__mul__(times)
        if repeated is NotImplemented:
            return NotImplemented
        for module in repeated._items[len(self._items):]:
            self.append(module)
        return self

    def forward(self, x):
        for module in self._items:
            x = module(x)
        return x

    def stream_stages(self, prefix: str = "") -> list:
        """The cut for the streaming route: one stage per entry that holds parameters, the entries without any
        (activations, dropout, flatten) riding in the stage before them (the leading ones in the first stage), so
        no stage boundary keeps an activation nothing trains on. Composed in order they are this forward.
        Stage names are the entries' names, `prefix` before them ("net.0", or "net.0-1" for entries 0 and 1)."""
        from ..stream.stages import Stage  # lazy: nn loads without the streaming machinery

        trained = [any(True for _ in module.parameters()) for module in self._items]
        groups: list[list[int]] = []
        for i, has_params in enumerate(trained):
            if not groups or has_params:
                groups.append([i])
            else:
                groups[-1].append(i)
        if len(groups) > 1 and not trained[groups[0][0]]:
            leading = groups.pop(0)  # parameterless entries before any trained one join the first stage with some
            groups[0] = leading + groups[0]
        names = self._entry_names()
        _refuse_shared(self, names, groups, prefix)
        stages = []
        for group in groups:
            modules = [self._items[i] for i in group]
            label = names[group[0]] if len(group) == 1 else f"{names[group[0]]}-{names[group[-1]]}"
            params = tuple(p for m in modules for p in m.parameters())
            stages.append(Stage(prefix + label, params, _Chain(modules)))
        return stages


def _refuse_shared(seq: Sequential, names: list[str], groups: list[list[int]], prefix: str) -> None:
    """StreamingUnsupportedError naming the two entries' parameters when one parameter is in two stages (the same
    module at two positions, or a tied weight). model_stages refused it too, but named only a shape and the stage
    labels ("a parameter of shape (16, 16) is in stages '1-2' and '3'"), with nothing to do about it."""
    from ..stream.stages import StreamingUnsupportedError

    owner: dict[int, tuple[int, int, str]] = {}  # id(parameter) -> (its stage, its entry, its name there)
    for stage, group in enumerate(groups):
        for i in group:
            for name, p in seq._items[i].named_parameters(prefix=prefix + names[i]):
                first_stage, first_entry, first_name = owner.setdefault(id(p), (stage, i, name))
                if first_stage == stage:
                    continue
                module = seq._items[i]
                entries = f"entries {prefix + names[first_entry]!r} and {prefix + names[i]!r}"
                how = (f"{entries} are the same {type(module).__name__}" if seq._items[first_entry] is module
                       else f"a module or a tied weight that {entries} share")
                raise StreamingUnsupportedError(
                    f"{first_name} and {name} are one parameter ({how}), and the streaming route updates each "
                    f"stage's parameters on their own, once a step: it cannot train one that two stages use. Train "
                    f"this model with route='eager' or 'fused' (route='auto' takes one of them for it), or give "
                    f"each position a module of its own (copy.deepcopy) if they were not meant to share weights")


class _Chain:
    """Some of a Sequential's entries applied in order: one streaming stage's forward."""

    def __init__(self, modules: list[Module]) -> None:
        self.modules = modules

    def __call__(self, x):
        for module in self.modules:
            x = module(x)
        return x

    def __repr__(self) -> str:
        return f"_Chain({', '.join(type(m).__name__ for m in self.modules)})"

    def trace_key(self) -> tuple:
        """What this chain computes, for the route planner's one trace per identical stage (train/route_traces.py):
        each module's repr (its type and settings: a MaxPool2d(2) riding along changes the output's shape, a
        Dropout adds its mask) and its modes. Every chain is a _Chain, so the class name alone made stages of equal
        parameter shapes share a trace: the pooled stage's output taken for the unpooled one's (a crash further
        on), a Dropout's mask left uncounted. A module of the user's own class may keep settings its repr does not
        show: it is keyed by itself, so its stage shares no trace."""
        return tuple((repr(m), tuple(sub.training for sub in m.modules())) if _own_classes(m) else id(m)
                     for m in self.modules)


def _own_classes(module: Module) -> bool:
    """Whether `module` and everything in it are tensorarena's modules (whose reprs show their settings)."""
    return all(type(sub).__module__.startswith("tensorarena.") for sub in module.modules())


# -- activations and losses as modules (torch.nn's names and arguments) -----------------------------------------
# `inplace=True` is accepted, as ported models pass it (nn.LeakyReLU(0.2, inplace=True)), and the output is the
# same; the input is left unchanged, since ops here never write their input (only the result is used in a
# Sequential, so nothing a model computes differs).

class SiLU(Module):
    """x * sigmoid(x)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x) -> Tensor:
        return F.silu(x)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, x) -> Tensor:
        return F.sigmoid(x)


class LeakyReLU(Module):
    """x where x > 0, else negative_slope * x."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = float(negative_slope), inplace

    def forward(self, x) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    """x where x > 0, else alpha (exp(x) - 1)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = float(alpha), inplace

    def forward(self, x) -> Tensor:
        return F.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear above threshold."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    """softmax along `dim`."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        if dim is None:  # torch guesses a dim from the input's rank, with a deprecation warning
            raise TypeError(f"{type(self).__name__}: pass dim explicitly (e.g. dim=-1); torch's implicit choice of "
                            f"dim is deprecated")
        self.dim = dim

    def forward(self, x) -> Tensor:
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log_softmax along `dim`."""

    def forward(self, x) -> Tensor:
        return F.log_softmax(x, self.dim)


class _Loss(Module):
    """A loss module: checks `reduction` once, at construction, as torch's."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def _constant(self, name: str, value) -> None:
        """A class weight as torch keeps it: a buffer (in state_dict), never a parameter."""
        self.register_buffer(name, value if value is None or isinstance(value, Tensor) else Tensor(value))


class MSELoss(_Loss):
    """Mean squared error (F.mse_loss)."""

    def forward(self, input, target) -> Tensor:  # noqa: A002 - torch's name
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """Mean absolute error (F.l1_loss)."""

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """F.smooth_l1_loss with its beta."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """F.huber_loss with its delta."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class CrossEntropyLoss(_Loss):
    """F.cross_entropy for class-index targets, with ignore_index, label_smoothing and a class weight (a buffer)."""

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        self._constant("weight", weight)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target) -> Tensor:  # noqa: A002
        # One call whatever is set: a weight or label_smoothing set after construction is honoured (a separate
        # weighted branch once returned torch's weighted loss without the smoothing, silently).
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing, reduction=self.reduction)


class NLLLoss(_Loss):
    """F.nll_loss on log-probabilities, with a class weight (a buffer) and ignore_index."""

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self._constant("weight", weight)
        self.ignore_index = ignore_index

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class BCELoss(_Loss):
    """F.binary_cross_entropy on probabilities, with an elementwise weight (a buffer)."""

    def __init__(self, weight=None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self._constant("weight", weight)

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """F.binary_cross_entropy_with_logits, with weight and pos_weight (buffers)."""

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None) -> None:
        super().__init__(reduction)
        self._constant("weight", weight)
        self._constant("pos_weight", pos_weight)

    def forward(self, input, target) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


__all__ = ["Linear", "Embedding", "LayerNorm", "Dropout", "GELU", "ReLU", "Tanh", "Identity", "Sequential",
           "SiLU", "Sigmoid", "LeakyReLU", "ELU", "Softplus", "Softmax", "LogSoftmax", "MSELoss", "L1Loss",
           "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss"]
