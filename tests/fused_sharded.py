"""``FusedTrainerLoss`` under the sharding engines, run by ``tests/test_hf_fused_sharded.py`` with ``torchrun`` (gloo,
CPU); each mode writes what the test compares into OUT.

``fully_shard OUT``: FSDP2 by hand, the output layer in the root unit, as a unit of its own (resharded after its
forward, or kept), and tied to the embeddings in one unit with them. Each rank scores its half of a batch with the
fused loss; rank 0 writes, per case and loss, the largest difference of the loss and of every parameter's gradient
from the unfused ``TrainerLoss`` on the whole batch in one process, and the warnings torch gave; and what the fused
loss says of an output layer split by tensor parallelism (``fully_shard.json``).

``trainer ENGINE LOSS STEPS OUT [--unfused]``: ``STEPS`` updates of 4 rows with the fused ``LOSS`` (with
``--unfused``: ``TrainerLoss``) through ``transformers.Trainer``, on one process (ENGINE "none") or two: "ddp",
"fsdp2" (the model loaded with transformers' ``DistributedConfig(fsdp_size=2)``, its own FSDP2 plan), "zero3"
(DeepSpeed ZeRO-3). Rank 0 writes the final weights and the logged losses (``ENGINE-LOSS[-unfused].pt``).
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import transformers

from sparse_softmax.hf import FusedTrainerLoss, TrainerLoss
from test_hf_adapters import _Batches, _token_rows
from test_hf_fused import VOCAB, model_of

LOSSES = {"softmax": {"label_smoothing": 0.1}, "sparse_softmax": {"k": 20}, "as_softmax": {"delta": 0.05}}
PLACEMENTS = ("root", "own", "own-kept", "tied")


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _llama(tied: bool):
    model = model_of("llama")
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def fully_shard_cases(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (4, 9), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    items = (labels[:, 1:] != -100).sum()
    mine = slice(rank * 4 // world, (rank + 1) * 4 // world)
    report = {}
    for placement in PLACEMENTS:
        for name, options in LOSSES.items():
            reference = _llama(placement == "tied")
            want = TrainerLoss(name, causal_lm=True, **options)(reference(input_ids=ids), labels, items)
            want.backward()
            model = _llama(placement == "tied")
            loss = FusedTrainerLoss(model, name, **options)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            if placement == "tied":
                fully_shard([model.model.embed_tokens, model.lm_head], mesh=mesh)
            elif placement.startswith("own"):
                fully_shard(model.lm_head, mesh=mesh, reshard_after_forward=placement == "own")
            fully_shard(model, mesh=mesh)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(2):  # a second step: the state FSDP keeps between steps
                    model.zero_grad()
                    got = loss(model(input_ids=ids[mine]), labels[mine], items)
                    got.backward()
            total = got.detach().clone()
            dist.all_reduce(total)
            # FSDP averages the gradients over the ranks; each rank's loss is its share of the whole batch's sum
            gaps = {key: float((_full(p.grad) * world - q.grad).abs().max())
                    for (key, p), q in zip(model.named_parameters(), reference.parameters())}
            report[f"{placement}/{name}"] = {"loss": float((total - want.detach()).abs()), "gradients": gaps,
                                             "warnings": sorted({str(w.message).split(".")[0] for w in caught})}
    report["tensor-parallel"] = _tensor_parallel_refusal(mesh, ids[mine], labels[mine], items)
    if rank == 0:
        with open(os.path.join(out, "fully_shard.json"), "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


def _tensor_parallel_refusal(mesh, ids, labels, items) -> str:
    """What the fused loss says of an output layer split by tensor parallelism (its weight a DTensor inside its own
    forward too)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    model = _llama(tied=False)
    loss = FusedTrainerLoss(model, "sparse_softmax", k=20)
    parallelize_module(model.lm_head, mesh, ColwiseParallel())
    try:
        loss(model(input_ids=ids), labels, items)
    except ValueError as refused:
        return str(refused)
    return "not refused"


def trainer_run(engine: str, name: str, steps: int, out: str, unfused: bool) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = model_of("llama")  # before TrainingArguments: under their ZeRO-3 it would be made by zero.Init, otherwise
    extra = {}
    if engine == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")  # with use_cpu, accelerate leaves DeepSpeed's own comm unset
        extra["deepspeed"] = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                              "train_batch_size": "auto", "gradient_clipping": "auto",
                              "zero_allow_untested_optimizer": True,
                              # threshold 0: every parameter partitioned, however small (the default keeps small ones
                              # whole); the whole weights gathered for the state dict the test compares
                              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                                    "stage3_gather_16bit_weights_on_model_save": True}}
    args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=4 // world, max_steps=steps,
                                          learning_rate=1e-2, report_to="none", use_cpu=True, save_strategy="no",
                                          disable_tqdm=True, seed=0, lr_scheduler_type="constant", logging_steps=1,
                                          ddp_backend="gloo" if world > 1 else None, **extra)
    if engine == "fsdp2":
        start = os.path.join(out, "start")
        model.save_pretrained(start)  # by rank 0 (the process group is up since TrainingArguments)
        dist.barrier()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            start, distributed_config=transformers.DistributedConfig(fsdp_size=world))
    options = LOSSES[name]
    loss = TrainerLoss(name, causal_lm=True, **options) if unfused else FusedTrainerLoss(model, name, **options)
    rows = [{"input_ids": ids, "labels": ids} for ids in _token_rows(16, 10, VOCAB)] * steps  # learnt by heart
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Batches(rows), compute_loss_func=loss)
    trainer.train()
    if engine == "zero3":
        weights = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    else:
        weights = {key: _full(p).detach() for key, p in model.named_parameters()}
    if int(os.environ.get("RANK", "0")) == 0:
        losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
        run = f"{engine}-{name}{'-unfused' if unfused else ''}"
        torch.save({"weights": weights, "losses": losses}, os.path.join(out, f"{run}.pt"))


if __name__ == "__main__":
    if sys.argv[1] == "fully_shard":
        fully_shard_cases(sys.argv[2])
    else:
        trainer_run(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], "--unfused" in sys.argv)
