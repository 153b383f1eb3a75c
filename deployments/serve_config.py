"""What a Serve application of specray is built from: the engine config plus the serving knobs.

``ServeArgs`` is the ``args:`` block of an application in a Serve config file
(``ray_configs/serve_*.yaml``, ``import_path: deployments.app:app_builder``) and what
``specray serve`` builds from its flags. Unknown keys are errors, so a typo in a YAML file fails
at deploy time with the key named instead of being silently ignored.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.config import EngineConfig, KVTierConfig


class AutoscalingArgs(BaseModel):
    """Ray Serve ``autoscaling_config`` of the engine deployment (the fields specray sets)."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(8.0, gt=0)
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(120.0, ge=0)

    @model_validator(mode="after")
    def _check_range(self):
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas={self.max_replicas} is below min_replicas={self.min_replicas}")
        return self

    def to_serve(self) -> dict:
        return self.model_dump(exclude_none=True)


class ServeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: EngineConfig = Field(default_factory=EngineConfig)
    served_model_name: str | None = Field(None, description="name clients pass as `model`; default engine.model")
    # Authorization: Bearer <key> required on /v1/* when set; api_key_env names an environment
    # variable holding it (so keys stay out of YAML files).
    api_key: str | None = None
    api_key_env: str | None = None
    max_request_bytes: int = Field(1_000_000, ge=1024, description="larger bodies get 413")
    # Admission (deployments/admission.py): a replica runs at most max_ongoing_requests sequences (a
    # request with n choices counts n); up to max_queued_requests more requests wait in its line, each
    # at most queue_timeout_s; the rest are answered 429 with Retry-After and an OpenAI body, never a
    # hang. Serve's own limits sit above these, so Serve never answers overload itself
    # (deployments.app.deployment_options).
    max_ongoing_requests: int = Field(16, ge=1)
    max_queued_requests: int = Field(32, ge=0)
    queue_timeout_s: float = Field(30.0, gt=0, description="a queued request waits at most this long, then 429")
    retry_after_s: int = Field(1, ge=1)
    num_replicas: int = Field(1, ge=1, description="fixed replica count when autoscaling is not set")
    autoscaling: AutoscalingArgs | None = None
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # > 1, or drafters > 0: the replica runs only the step loop; the target is sharded over
    # tensor_parallel_size verifier actors (one placement group per replica, STRICT_PACK, one GPU per
    # rank on CUDA) and drafts come from `drafters` drafter-worker actors. num_gpus then stays 0:
    # the ranks hold the GPUs.
    tensor_parallel_size: int = Field(1, ge=1, le=16)
    drafters: int = Field(0, ge=0, le=8)
    allow_no_spec: bool = Field(False, description="serve without speculation if a drafter fails to load")
    graceful_shutdown_timeout_s: float = Field(30.0, ge=0, description="in-flight streams finish within this")
    health_check_period_s: float = Field(10.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    # The shared KV tier across this application's replicas (cluster.config.KVTierConfig): started
    # by the app builder (deployments/kv_tier.py), one per application; engine.kv_tier is the same
    # setting for one engine (`specray serve --kv-tier-gb`), give one or the other.
    kv_tier: KVTierConfig = Field(default_factory=KVTierConfig)

    @property
    def uses_ray_actors(self) -> bool:
        return self.tensor_parallel_size > 1 or self.drafters > 0

    @model_validator(mode="after")
    def _check_draft_placement(self):
        if self.uses_ray_actors and self.engine.speculative.method == "eagle":
            raise ValueError(f"an EAGLE draft (--draft default / eagle / eagle:PATH / default:PATH) reads the "
                             f"target's hidden states in the replica's own process: it cannot run with "
                             f"tensor_parallel_size={self.tensor_parallel_size} / drafters={self.drafters}; use "
                             f"tensor_parallel_size 1 and drafters 0, or draft with ngram, layerskip:N or a draft model")
        return self

    @model_validator(mode="after")
    def _check_gpus(self):
        if self.uses_ray_actors and self.num_gpus:
            raise ValueError(f"num_gpus={self.num_gpus} with tensor_parallel_size={self.tensor_parallel_size}/"
                             f"drafters={self.drafters}: the verifier ranks hold the GPUs, leave num_gpus at 0")
        return self

    @model_validator(mode="after")
    def _check_kv_tier(self):
        if self.kv_tier.enabled and self.engine.kv_tier.enabled:
            raise ValueError("kv_tier is set twice (kv_tier and engine.kv_tier): give it once, as kv_tier")
        tier = self.effective_kv_tier
        if tier.enabled and self.uses_ray_actors:
            raise ValueError(f"kv_tier.enabled=true with tensor_parallel_size={self.tensor_parallel_size}/"
                             f"drafters={self.drafters}: the shared tier copies blocks in and out of the replica's "
                             "own KV cache; use tensor_parallel_size 1 and drafters 0, or turn kv_tier off")
        return self

    @property
    def effective_kv_tier(self) -> KVTierConfig:
        """The application's shared tier: ``kv_tier``, else ``engine.kv_tier``."""
        return self.kv_tier if self.kv_tier.enabled else self.engine.kv_tier

    @property
    def min_replicas(self) -> int:
        """Replicas Serve starts at once (autoscaling: its initial or minimum count)."""
        if self.autoscaling is None:
            return self.num_replicas
        a = self.autoscaling
        return a.initial_replicas if a.initial_replicas is not None else a.min_replicas

    def replica_resources(self) -> tuple[dict[str, float], list[dict[str, float]]]:
        """(the replica actor's resources, its placement group's bundles: [] in-process)."""
        replica = {"CPU": self.num_cpus, "GPU": self.num_gpus}
        if not self.uses_ray_actors:
            return replica, []
        from cluster.runtime import resolve_device_dtype
        from cluster.topology import ReplicaTopology

        device, _ = resolve_device_dtype(self.engine.device, self.engine.dtype)
        topo = ReplicaTopology(tp_size=self.tensor_parallel_size, num_drafters=self.drafters,
                               use_gpu=device.type == "cuda")
        return replica, topo.bundles()

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model

    def resolved_api_key(self) -> str | None:
        import os

        if self.api_key:
            return self.api_key
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None
