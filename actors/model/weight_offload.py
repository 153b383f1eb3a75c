"""Weight offload: decoder layers beyond the device budget live in host memory and stream in.

The matrices of the last ``num_layers`` decoder layers (the products' weights: q/k/v, o, gate/up,
down; norms and biases stay resident, they are <0.5% of a layer) are kept in host memory, pinned on
CUDA, and copied into one of two device staging slots just before the layer runs. A forward
pre-hook on every layer makes the current layer resident (waits for its copy) and issues the copy
of the next offloaded layer into the other slot, on a side stream on CUDA, so it overlaps the
current layer's compute; the last offloaded layer prefetches the first for the next forward. With
n >= 3 offloaded layers each forward streams every one of them once: a forward costs about
max(compute, transfer) per layer, whatever the number of tokens it carries, which is why verifying
a token tree amortises the transfer (SpecInfer): the adaptive policy measures the slower forward
(actors/spec_policy.py, ``t_verify``) and drafts deeper.

On CPU the same code runs with host memory as the "device": the copies are synchronous (nothing
overlaps) and the slots hold the weights in oneDNN's blocked layout, copied from blocked host
copies, so a product reads exactly what it reads without offload (kernels/cpu_linear.py): outputs
are identical with 0, some or all layers offloaded. Not for CUDA graphs: a replay would not run the
hooks that decide what to copy (the verifier runs eager when layers are offloaded).
"""
from __future__ import annotations

import time
from functools import partial

import torch
from torch import nn

from kernels import cpu_linear

OFFLOAD_SLOTS = 2  # the layer being computed and the one being copied in


def layer_weights(layer: nn.Module) -> list[nn.Parameter]:
    """The matrices a decoder layer's products read (what offload streams), in a fixed order."""
    return [p for p in layer.parameters() if p.dim() == 2]


def layer_weight_bytes(layer: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer_weights(layer))


def device_weight_bytes(model: nn.Module, num_offloaded: int) -> int:
    """Bytes of ``model``'s weights on the device with its last ``num_offloaded`` layers streamed:
    the resident parameters and the staging slots (measure before offloading)."""
    per_layer = layer_weight_bytes(model.layers[0])
    return model.param_bytes() - num_offloaded * per_layer + min(num_offloaded, OFFLOAD_SLOTS) * per_layer


def layers_to_offload(model: nn.Module, weights_device_gb: float) -> int:
    """How many decoder layers (the last ones) must live in host memory for the model's weights on
    the device to fit ``weights_device_gb``: resident parameters + the staging slots."""
    num_layers = len(model.layers)
    for n in range(num_layers + 1):
        if device_weight_bytes(model, n) <= weights_device_gb * 2**30:
            return n
    raise ValueError(f"weights_device_gb={weights_device_gb} is too small for this model: with every decoder "
                     f"layer offloaded it still needs {device_weight_bytes(model, num_layers) / 2**30:.3f} GiB on "
                     f"the device (embeddings, LM head, norms and {OFFLOAD_SLOTS} staging layers)")


def load_device(device: torch.device | str, offloading: bool) -> torch.device:
    """Where to load a model that will have layers offloaded to run on ``device``: the host when
    that is an accelerator (the offloader moves all but the streamed matrices), else ``device``."""
    device = torch.device(device)
    return torch.device("cpu") if offloading and device.type != "cpu" else device


class WeightOffloader:
    """Keeps the last ``num_layers`` decoder layers' matrices in host memory and streams them into
    staging slots on ``device`` as the forward reaches them (see the module doc). Counters:
    ``bytes_copied``, ``layers_copied``, ``copy_seconds`` (host-side seconds of the copies: the whole
    copy on CPU, only issuing them on CUDA)."""

    def __init__(self, model: nn.Module, num_layers: int, device: torch.device | str):
        layers = list(model.layers)
        if not 0 < num_layers <= len(layers):
            raise ValueError(f"offload_layers={num_layers} is out of range: the model has {len(layers)} decoder "
                             f"layers (use 1..{len(layers)}, or 0 for none)")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.offloaded = list(range(len(layers) - num_layers, len(layers)))
        self.slot_of = {i: j % OFFLOAD_SLOTS for j, i in enumerate(self.offloaded)}
        # the offloaded layer the forward reaches after layer i (the first one again after the last)
        self.next_of = {i: next((j for j in self.offloaded if j > i), self.offloaded[0]) for i in range(len(layers))}
        self.num_slots = min(OFFLOAD_SLOTS, num_layers)
        self.bytes_copied = self.layers_copied = 0
        self.copy_seconds = 0.0
        weights = {i: layer_weights(layers[i]) for i in self.offloaded}
        first = weights[self.offloaded[0]]
        self.packed = not self.cuda and all(cpu_linear.packs(w) for w in first)
        self.host = {i: [self._host_copy(w) for w in ws] for i, ws in weights.items()}  # [layer][k]
        self.layer_bytes = layer_weight_bytes(layers[self.offloaded[0]])
        for ws in weights.values():  # the plain copies go; what stays is a shape without storage
            for w in ws:
                w.data = torch.zeros((1, 1), dtype=w.dtype, device=self.device).expand(w.shape)
        model.to(self.device)  # whatever was staged on the host (loaded there to fit) but the offloaded matrices
        # slots[s][k]: where the layer in slot s keeps its k-th matrix on the device
        self.slots = [[self._empty_like(h) for h in self.host[self.offloaded[0]]] for _ in range(self.num_slots)]
        for i, ws in weights.items():
            for w, buf in zip(ws, self.slots[self.slot_of[i]]):
                if self.packed:
                    cpu_linear.bind_reordered(w, buf)
                else:
                    w.data = buf
        self.owner: list[int | None] = [None] * self.num_slots  # which layer each slot holds (or is receiving)
        self.ready: list[torch.cuda.Event | None] = [None] * self.num_slots
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._hooks = [layer.register_forward_pre_hook(partial(self._before_layer, i)) for i, layer in enumerate(layers)]

    # ---- setup ---------------------------------------------------------------------------------
    def _host_copy(self, w: torch.Tensor) -> torch.Tensor:
        if not self.cuda and cpu_linear.packs(w):
            return cpu_linear.pack(w)
        out = torch.empty(w.shape, dtype=w.dtype, device="cpu", pin_memory=self.cuda)
        out.copy_(w.detach())
        return out

    def _empty_like(self, host: torch.Tensor) -> torch.Tensor:
        if host.layout == torch._mkldnn:  # an opaque blocked tensor: a copy of one is a slot of its layout
            return host.clone()
        return torch.empty(host.shape, dtype=host.dtype, device=self.device)

    # ---- the forward's hooks ---------------------------------------------------------------------
    def _before_layer(self, i: int, module: nn.Module, args) -> None:
        slot = self.slot_of.get(i)
        if slot is not None:
            if self.owner[slot] != i:
                self._load(i)
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        nxt = self.next_of[i]
        if self.slot_of[nxt] != slot and self.owner[self.slot_of[nxt]] != nxt:
            self._load(nxt)  # the other slot: its layer has run (it is before i, or it is i's predecessor)

    def _load(self, i: int) -> None:
        slot = self.slot_of[i]
        t0 = time.perf_counter()
        if self.cuda:  # after everything the compute stream has queued so far (the slot's last reader)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for dst, src in zip(self.slots[slot], self.host[i]):
                    dst.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            self.ready[slot] = event
        else:
            for dst, src in zip(self.slots[slot], self.host[i]):
                dst.copy_(src)
        self.copy_seconds += time.perf_counter() - t0
        self.owner[slot] = i
        self.bytes_copied += self.layer_bytes
        self.layers_copied += 1

    # ---- figures -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.offloaded)

    @property
    def host_bytes(self) -> int:
        return self.layer_bytes * len(self.offloaded)

    @property
    def staging_bytes(self) -> int:
        return self.layer_bytes * self.num_slots

    def stats(self) -> dict[str, float]:
        return {"layers": self.num_layers, "host_bytes": self.host_bytes, "staging_bytes": self.staging_bytes,
                "bytes_copied": self.bytes_copied, "layers_copied": self.layers_copied,
                "copy_seconds": self.copy_seconds}


def offload_weights(model: nn.Module, num_layers: int, device: torch.device | str) -> WeightOffloader | None:
    """Offload the last ``num_layers`` decoder layers of ``model`` (0: none; the model is moved to
    ``device`` either way, as one loaded on the host to fit is). A model is offloaded once."""
    done = getattr(model, "weight_offloader", None) is not None
    if not num_layers:
        if not done:  # an offloaded model stays as it is: its streamed matrices have no device copy
            model.to(device)
        return None
    if done:
        raise ValueError("this model's layers are already offloaded (by another Verifier); load it again "
                         "for a second one")
    offloader = WeightOffloader(model, num_layers, device)
    model.weight_offloader = offloader
    return offloader


def offload_layers_for(layers: int, weights_device_gb: float | None, model: nn.Module) -> int:
    """The number of layers to offload for ``offload.layers`` / ``offload.weights_device_gb``."""
    if weights_device_gb is not None:
        return layers_to_offload(model, weights_device_gb)
    return layers
