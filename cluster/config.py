"""Engine-wide configuration (pydantic), validated once at the edge."""
from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_serializer, model_validator

from actors.kv_swap import PREEMPTION_MODES
from actors.tree import expansion_num_nodes, parse_expansion
from cluster.spec_guard import FallbackGuardConfig
from cluster.traffic import TrafficClasses

DEFAULT_MODEL = "smollm2-135m"
# EAGLE drafts grow a dynamic tree of this width, capped at this many nodes, unless told otherwise:
# on the 2-core CPU as fast as a chain at concurrency 1 and 8-15% faster at 16-64
# (benchmarks/ARCHIVE.md, eleventh session, when a verified row cost next to nothing)
DEFAULT_TREE_WIDTH, DEFAULT_TREE_NODES = 3, 10
# ... and on the CPU since its products became compute-bound (each verified row ~10% of a decode
# step): width 2 (still 10 nodes at K=5) was 5-7% faster than 3 at c=1 in every round, on held-out
# and bench500 prompts (benchmarks/ARCHIVE.md, "drafts shaped for what a verified row costs", 2026-11-29)
CPU_TREE_WIDTH = 2


def default_tree_width(device_type: str) -> int:
    """The dynamic trees' width an EAGLE draft gets on ``device_type`` unless told otherwise."""
    return CPU_TREE_WIDTH if device_type == "cpu" else DEFAULT_TREE_WIDTH


# --draft names of the committed head (default: prompt lookup first; default-chain: the same with
# lookup drafting K-token chains, as before issue 29, see SpeculativeConfig.lookup_width)
EAGLE_DRAFTS = ("default", "default-chain", "eagle")
EAGLE_DRAFT_PREFIXES = ("eagle:", "default:")  # the same with a head file: eagle:PATH, default:PATH


class SpeculativeConfig(BaseModel):
    """What proposes draft tokens and how many.

    ``method``: none | ngram | layerskip | draft | eagle. ``num_spec_tokens`` (K) is the chain length;
    ``tree`` (an expansion config such as 1,1,3,1,1) replaces the chain with a token tree.
    ``eagle_head``: an EAGLE head file (actors/eagle); None = the head committed for the model.
    ``lookup_first``: draft by prompt lookup where a suffix of >= 2 tokens recurs and by the
    proposer of ``method`` elsewhere (``--draft default``: lookup, then the committed EAGLE head).
    ``lookup_width``: draft nodes per depth that such a lookup draft reserves and fills, at most
    ``tree_width`` and within ``tree_nodes`` (NgramProposer's width: farther along a copied text,
    and a second continuation, matching suffixes of up to 16 tokens); 1 = a chain of K after a match of
    up to ``ngram_max`` tokens (``--draft default-chain``: the default before issue 29).
    ``tree_width`` > 1 (EAGLE only): instead of a chain, a dynamic tree keeping the ``tree_width``
    likeliest candidates per depth, up to ``tree_width`` x K nodes (actors/proposers/dynamic_tree.py);
    ``tree_nodes`` caps that tree at fewer nodes (EAGLE-2's total-token budget): the width explores,
    the cap keeps the verify forward small. Unseeded sampled requests cannot take a dynamic tree
    (its candidates are not draws from q): they draft a chain with up to ``tree_width`` distinct
    draws at its first depth, within the cap; ``sampled_siblings`` sets how many, at most ``tree_width``
    (None: ``tree_width`` on a GPU, where a verified row costs little, and 1 on the CPU, where each
    costs ~10% of a decode step and a second draw added ~0.05 accepted tokens at T=1). Unset, an
    EAGLE draft without a fixed ``tree`` gets DEFAULT_TREE_WIDTH (CPU_TREE_WIDTH on the CPU: see
    ``for_device``, which the engine applies) and DEFAULT_TREE_NODES, every other method a chain
    (width 1)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["none", "ngram", "layerskip", "draft", "eagle"] = "none"
    num_spec_tokens: int = Field(5, ge=0, le=64)
    tree: list[int] | None = None
    layerskip_layers: int | None = Field(None, ge=1)
    draft_model: str | None = None
    eagle_head: str | None = None
    lookup_first: bool = False
    lookup_width: int = Field(2, ge=1, le=8)
    ngram_min: int = Field(1, ge=1)
    ngram_max: int = Field(4, ge=1)
    tree_width: int | None = Field(None, ge=1, le=8)
    tree_nodes: int | None = Field(None, ge=1, le=64)
    sampled_siblings: int | None = Field(None, ge=1, le=8)
    # Choose each sequence's depth per step (0..K) from measured draft/verify costs and acceptance
    # (actors/spec_policy.py); False = always the full K / tree. Requests with spec_tokens set keep it.
    adaptive: bool = True
    # Per-request rules on top of that: the first class a request matches (by max_tokens, temperature,
    # running sequences) turns its speculation on, off or caps its K (cluster/traffic.py).
    traffic_classes: TrafficClasses = Field(default_factory=list)
    # Speculation off for a cool-down while its measured gain stays below 1.0 (cluster/spec_guard.py).
    fallback_guard: FallbackGuardConfig = Field(default_factory=FallbackGuardConfig)
    _default_width: bool = PrivateAttr(False)  # tree_width was left to the default: for_device may set it

    @field_validator("tree", mode="before")
    @classmethod
    def _parse_tree(cls, v):
        return None if v is None else parse_expansion(v)

    @model_validator(mode="after")
    def _check_method_args(self):
        if self.tree_width is None:  # the method's default shape
            dynamic = self.method == "eagle" and self.tree is None
            self.tree_width = DEFAULT_TREE_WIDTH if dynamic else 1
            self._default_width = dynamic
            if dynamic and self.tree_nodes is None:
                self.tree_nodes = DEFAULT_TREE_NODES
        if self.method == "layerskip" and self.layerskip_layers is None:
            raise ValueError("method 'layerskip' needs layerskip_layers (use --draft layerskip:N)")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model (a local path)")
        if self.tree_width > 1 and (self.method != "eagle" or self.tree is not None):
            raise ValueError(f"tree_width={self.tree_width} grows dynamic trees with an EAGLE head: use it with "
                             f"--draft default/eagle and without a fixed tree (got method {self.method!r}"
                             + (f", tree {self.tree}" if self.tree is not None else "") + ")")
        if self.sampled_siblings is not None and self.sampled_siblings > self.tree_width:
            raise ValueError(f"sampled_siblings={self.sampled_siblings}: at most the tree width ({self.tree_width}), "
                             f"whose nodes the scheduler reserves")
        if self.tree_nodes is not None and self.tree_width == 1:
            raise ValueError(f"tree_nodes={self.tree_nodes} caps a dynamic tree's nodes: use it with an EAGLE draft "
                             f"(--draft default/eagle) and a tree width > 1 (got method {self.method!r}, width 1)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """A width left to the default is written as unset, so that a configuration that travels as a
        dict or JSON (Serve hands its replicas the app's args that way) still gets the device's
        default where it is rebuilt."""
        out = handler(self)
        if self._default_width and isinstance(out, dict):
            out["tree_width"] = None
        return out

    def for_device(self, device_type: str) -> "SpeculativeConfig":
        """This configuration with the draft shape left unset chosen for the device the engine runs
        on: on the CPU, where each verified row costs ~10% of a decode step, dynamic trees of
        CPU_TREE_WIDTH and one sampled draw at a chain's first depth; elsewhere DEFAULT_TREE_WIDTH
        and tree_width draws. Values set explicitly are kept."""
        width = self.tree_width
        if self._default_width:  # wide enough for the draws asked for
            width = max(default_tree_width(device_type), self.sampled_siblings or 1)
        siblings = self.sampled_siblings or (1 if device_type == "cpu" else width)
        if (width, siblings) == (self.tree_width, self.sampled_siblings):
            return self
        return self.model_copy(update={"tree_width": width, "sampled_siblings": siblings})

    @property
    def enabled(self) -> bool:
        return self.method != "none" and self.max_nodes > 0

    @property
    def expansion(self) -> list[int]:
        return list(self.tree) if self.tree is not None else [1] * self.num_spec_tokens

    @property
    def max_nodes(self) -> int:
        """Draft nodes one sequence may verify in a step: a dynamic tree within its cap, or the chain
        that unseeded sampled requests draft instead (with up to tree_width distinct draws at its
        first depth, within the cap; a chain longer than the cap stays a chain)."""
        n = expansion_num_nodes(self.expansion)
        return max(self.draft_nodes(n, self.tree_width), n)

    def draft_nodes(self, depth_nodes: int, width: int) -> int:
        """Draft nodes of a draft with ``depth_nodes`` chain/tree nodes at ``width`` nodes per depth
        (a dynamic tree's width, else 1), within the dynamic trees' cap."""
        n = depth_nodes * width
        return min(n, self.tree_nodes) if width > 1 and self.tree_nodes is not None else n

    @classmethod
    def from_draft_arg(cls, draft: str, num_spec_tokens: int = 5, tree=None,
                       adaptive: bool = True, tree_width: int | None = None,
                       tree_nodes: int | None = None, sampled_siblings: int | None = None) -> "SpeculativeConfig":
        """Parse the CLI/API form: ``none``, ``ngram``, ``layerskip:N``, ``default`` (prompt lookup
        where the text repeats, the committed EAGLE head of the model elsewhere), ``eagle`` (that head
        alone), ``eagle:PATH`` (an EAGLE head file), ``default:PATH`` (prompt lookup, then that head
        file) or a draft model path/alias."""
        draft = (draft or "none").strip()
        kw = dict(num_spec_tokens=num_spec_tokens, tree=tree, adaptive=adaptive, tree_width=tree_width,
                  tree_nodes=tree_nodes, sampled_siblings=sampled_siblings)
        if draft in ("none", "ngram"):
            return cls(method=draft, **kw)
        if draft in EAGLE_DRAFTS:
            return cls(method="eagle", lookup_first=draft != "eagle", lookup_width=1 if draft == "default-chain" else 2,
                       **kw)
        if draft.startswith(EAGLE_DRAFT_PREFIXES):
            kind, _, path = draft.partition(":")
            if not path.strip():
                raise ValueError(f"draft {draft!r}: expected {kind}:PATH with PATH an EAGLE head file (.safetensors)")
            return cls(method="eagle", eagle_head=path.strip(), lookup_first=kind == "default", **kw)
        if draft.startswith("layerskip"):
            _, _, n = draft.partition(":")
            if not n.isdigit() or int(n) < 1:
                raise ValueError(f"draft {draft!r}: expected layerskip:N with N a positive number of layers")
            return cls(method="layerskip", layerskip_layers=int(n), **kw)
        return cls(method="draft", draft_model=draft, **kw)


def is_eagle_draft(draft: str) -> bool:
    """``--draft`` forms that draft with an EAGLE head (and can grow dynamic trees)."""
    return draft in EAGLE_DRAFTS or draft.startswith(EAGLE_DRAFT_PREFIXES)


class KVOffloadConfig(BaseModel):
    """KV tiers below the device pool. ``host_gb``: a host-memory tier of that many GiB for
    prefix-cache blocks the device pool evicts (0/None = off); ``host_blocks`` sizes it in blocks
    instead (tests). ``disk_dir`` + ``disk_gb`` (or ``disk_blocks``): a disk tier below the host
    tier, in one preallocated file in that directory, which one engine holds at a time; it needs
    the host tier. ``preemption``: how a preempted sequence gives its device blocks back: ``swap``
    them to the host tier and back (needs the host tier; recompute when it has no room),
    ``recompute`` its context later, or ``auto``: swap when the host tier has room and the measured
    copy cost is below the measured prefill cost (actors/kv_swap.py; recompute without a host tier).
    The shared tier across replicas is ``EngineConfig.kv_tier`` (KVTierConfig)."""

    model_config = ConfigDict(extra="forbid")

    host_gb: float | None = Field(None, ge=0)
    host_blocks: int | None = Field(None, ge=0)
    disk_dir: str | None = None
    disk_gb: float | None = Field(None, ge=0)
    disk_blocks: int | None = Field(None, ge=0)
    preemption: Literal["auto", "swap", "recompute"] = "auto"

    @field_validator("preemption", mode="before")
    @classmethod
    def _known_mode(cls, v):
        if v not in PREEMPTION_MODES:
            raise ValueError(f"kv_offload.preemption={v!r} is not a preemption mode: use one of "
                             f"{', '.join(PREEMPTION_MODES)} (--kv-preemption)")
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.host_blocks) if self.host_blocks is not None else bool(self.host_gb)

    @property
    def disk_enabled(self) -> bool:
        return bool(self.disk_blocks) if self.disk_blocks is not None else bool(self.disk_gb)

    @model_validator(mode="after")
    def _disk_needs_dir_and_host(self) -> KVOffloadConfig:
        size = f"disk_blocks={self.disk_blocks}" if self.disk_blocks is not None else f"disk_gb={self.disk_gb}"
        if self.disk_enabled and not (self.disk_dir or "").strip():
            raise ValueError(f"kv_offload.{size} needs disk_dir: the directory of the disk tier's file "
                             "(--kv-disk-dir D)")
        if self.disk_dir and not self.disk_enabled:
            raise ValueError(f"kv_offload.disk_dir={self.disk_dir!r} needs a size: disk_gb > 0 (--kv-disk-gb G)")
        if self.disk_enabled and not self.enabled:
            raise ValueError(f"kv_offload.{size} needs the host tier (host_gb > 0, --kv-host-gb G): the disk "
                             "tier holds what the host tier overflows")
        if self.preemption == "swap" and not self.enabled:
            raise ValueError("kv_offload.preemption='swap' needs the host tier (host_gb > 0, --kv-host-gb G): "
                             "swapped-out blocks wait there; use 'auto' or 'recompute' without it")
        return self


class WeightOffloadConfig(BaseModel):
    """Weight offload (actors/model/weight_offload.py): the last ``layers`` decoder layers' matrices
    live in host memory (pinned on CUDA) and stream into two device staging slots as each forward
    reaches them; or ``weights_device_gb``: offload as many layers as the weights need to fit that
    many GiB of device memory (staging slots included). The adaptive policy measures the slower
    forward and drafts deeper to amortise it. CUDA graphs are off while layers are offloaded."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(0, ge=0)
    weights_device_gb: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_way(self) -> WeightOffloadConfig:
        if self.layers and self.weights_device_gb is not None:
            raise ValueError(f"offload.layers={self.layers} and offload.weights_device_gb={self.weights_device_gb} "
                             "both set: give the number of layers (--offload-layers) or the device budget "
                             "(--weights-device-gb), not both")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.layers) or self.weights_device_gb is not None


class KVTierConfig(BaseModel):
    """The shared KV tier across replicas (actors/kv_shared_tier.py): a named Ray actor holding
    prefix-cache blocks in the object store, ``capacity_gb`` of them (LRU). Replicas publish the
    prompt blocks they compute and fetch on a local miss; a fetch slower than ``fetch_timeout_ms``
    counts as a miss (recompute). ``name``: the actor's name (Serve: one per application, derived
    from the application's name when unset). ``owner``: ``engine``: the engine creates the actor if
    absent (in-process use; it lives as long as the engine's process); ``application``: the Serve
    application's tier host owns it and replicas only look it up (set by the app builder)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    capacity_gb: float = 4.0
    fetch_timeout_ms: float = 100.0
    name: str | None = None
    owner: Literal["engine", "application"] = "engine"

    @model_validator(mode="after")
    def _check_values(self) -> KVTierConfig:
        if self.capacity_gb <= 0:
            raise ValueError(f"kv_tier.capacity_gb={self.capacity_gb} must be > 0: the shared tier's size in GiB "
                             "(--kv-tier-gb G; leave kv_tier.enabled false to turn it off)")
        if self.fetch_timeout_ms <= 0:
            raise ValueError(f"kv_tier.fetch_timeout_ms={self.fetch_timeout_ms} must be > 0: how long a step may "
                             "wait for the shared tier before recomputing")
        if self.name is not None and not self.name.strip():
            raise ValueError(f"kv_tier.name={self.name!r} is empty: name the tier's actor, or leave it unset")
        return self

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gb * 2**30)


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_MODEL
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(512, ge=16)
    block_size: int = Field(16, ge=1, le=256)
    num_kv_blocks: int | None = Field(None, ge=1, description="None = sized from kv_cache_gb")
    kv_cache_gb: float = Field(1.0, gt=0)
    max_model_len: int | None = Field(None, ge=16)
    enable_prefix_caching: bool = True
    num_threads: int | None = Field(None, ge=1)
    # attention (and fused small ops) of the target: Triton kernels over the paged KV cache (CUDA), the
    # C++ CPU kernels (native), or the pure-torch reference; auto = triton on CUDA, native on CPU for
    # fp32 models where the kernels build, else torch (actors/model/attention_backends.py)
    attention_backend: Literal["auto", "torch", "triton", "native"] = "auto"
    # the KV cache's dtype: auto = the model's; bfloat16 under an fp32 model on CPU (native kernels)
    # halves what decode attention reads and doubles the blocks per GB, but changes the logits
    kv_cache_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # what the CPU products over a GGUF model's quantized blocks multiply (kernels/cpu_native.py, for
    # the whole process that runs the target): auto = SPECRAY_CPU_ACTIVATIONS (default int16); int8 is
    # faster verification with logits further from the fp32 model's; float32 keeps its bits
    cpu_activations: Literal["auto", "int16", "int8", "float32"] = "auto"
    # True: no CUDA graphs (decode and verify steps launch every kernel; debugging, comparisons)
    enforce_eager: bool = False
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    # >1: split each step into micro-batches so drafter workers draft one while the target verifies
    # another (needs remote drafters). Measured 0.83x on the 2-core CPU, hence off by default.
    draft_overlap_micro_batches: int = Field(1, ge=1, le=8)
    kv_offload: KVOffloadConfig = Field(default_factory=KVOffloadConfig)
    kv_tier: KVTierConfig = Field(default_factory=KVTierConfig)
    offload: WeightOffloadConfig = Field(default_factory=WeightOffloadConfig)


def engine_choices(field: str) -> tuple[str, ...]:
    """The values EngineConfig's ``Literal`` field ``field`` takes: what a command-line flag for it
    offers (``--attention-backend``, ``--kv-cache-dtype``, ``--cpu-activations``), from this one list."""
    return get_args(EngineConfig.model_fields[field].annotation)
