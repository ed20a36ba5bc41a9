"""Legitimate patterns that must not raise an alarm.

Each test runs a few real training steps with a :class:`~leafwatch.Monitor` created before the
first forward pass and an ``audit()`` after each backward, and asserts that neither finds
anything (or, where the pattern is intermittent by nature, nothing above ``info``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune
import torch.utils.checkpoint
from torch import nn

import leafwatch

STEPS = 3


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _batch() -> torch.Tensor:
    return torch.randn(4, 3)


def _train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    *,
    loss_of: Callable[[nn.Module], torch.Tensor] = lambda m: m(_batch()).sum(),
    steps: int = STEPS,
    audit_model: nn.Module | None = None,
    between_steps: Callable[[int], None] = lambda step: None,
    **monitor_kwargs,
) -> list[leafwatch.Report]:
    """Train a few steps; every Monitor report and every audit() report, in order."""
    reports = []
    with leafwatch.Monitor(model, opt, **monitor_kwargs) as monitor:
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model)
            loss.backward()
            reports.append(leafwatch.audit(audit_model or model, opt, step=step))
            reports.append(leafwatch.audit(audit_model or model, opt, loss=loss, step=step))
            reports.append(monitor.check())
            opt.step()
            between_steps(step)
        reports.append(monitor.close())
    return reports


def _assert_no_findings(reports: Sequence[leafwatch.Report]) -> None:
    for report in reports:
        assert report.findings == [], str(report)


def _assert_nothing_above_info(reports: Sequence[leafwatch.Report]) -> None:
    for report in reports:
        assert report.at_least("warning") == [], str(report)


# -- frozen parts ------------------------------------------------------------------------------------
def test_frozen_backbone_left_out_of_the_optimizer():
    model = TwoLayer()
    model.a.requires_grad_(False)
    _assert_no_findings(_train(model, torch.optim.SGD(model.b.parameters(), lr=0.1)))


def test_frozen_backbone_inside_the_optimizer_is_only_info():
    model = TwoLayer()
    model.a.requires_grad_(False)
    reports = _train(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _assert_nothing_above_info(reports)
    assert reports[-1].names("frozen_in_optimizer") == {"a.weight", "a.bias"}


class LoRALinear(nn.Module):
    def __init__(self, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(3, 3)
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, 3) * 0.01)
        self.lora_b = nn.Parameter(torch.zeros(3, rank))

    def forward(self, x):
        return self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()


def test_lora_with_a_frozen_base_left_out_of_the_optimizer():
    model = nn.Sequential(LoRALinear(), nn.ReLU(), LoRALinear())
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) == 4
    _assert_no_findings(_train(model, torch.optim.AdamW(trainable, lr=0.01)))


class EMA(nn.Module):
    """An online network and a target network updated by exponential moving average."""

    def __init__(self) -> None:
        super().__init__()
        self.online = TwoLayer()
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    def forward(self, x):
        with torch.no_grad():
            target = self.target(x)
        return (self.online(x) - target) ** 2


def test_ema_target_network_without_grad_and_not_in_the_optimizer():
    model = EMA()
    opt = torch.optim.SGD(model.online.parameters(), lr=0.1)

    def update_target(step: int) -> None:
        with torch.no_grad():
            for t, o in zip(model.target.parameters(), model.online.parameters()):
                t.lerp_(o, 0.1)

    _assert_no_findings(_train(model, opt, between_steps=update_target))


# -- parametrizations, weight norm, spectral norm, pruning ----------------------------------------------
class Symmetric(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu() + w.triu(1).transpose(-1, -2)


def _parametrized() -> nn.Module:
    model = TwoLayer()
    parametrize.register_parametrization(model.a, "weight", Symmetric())
    return model


def _weight_norm_new() -> nn.Module:
    model = TwoLayer()
    model.a = nn.utils.parametrizations.weight_norm(model.a)
    return model


def _weight_norm_legacy() -> nn.Module:
    model = TwoLayer()
    with pytest.warns(FutureWarning):
        model.a = nn.utils.weight_norm(model.a)
    return model


def _spectral_norm_new() -> nn.Module:
    model = TwoLayer()
    model.a = nn.utils.parametrizations.spectral_norm(model.a)
    return model


def _spectral_norm_legacy() -> nn.Module:
    model = TwoLayer()
    model.a = nn.utils.spectral_norm(model.a)
    return model


def _pruned() -> nn.Module:
    model = TwoLayer()
    nn.utils.prune.l1_unstructured(model.a, name="weight", amount=0.3)
    return model


@pytest.mark.parametrize(
    ("make", "trained_names"),
    [
        (_parametrized, {"a.parametrizations.weight.original"}),
        (_weight_norm_new, {"a.parametrizations.weight.original0", "a.parametrizations.weight.original1"}),
        (_weight_norm_legacy, {"a.weight_g", "a.weight_v"}),
        (_spectral_norm_new, {"a.parametrizations.weight.original"}),
        (_spectral_norm_legacy, {"a.weight_orig"}),
        (_pruned, {"a.weight_orig"}),
    ],
)
def test_reparametrized_weights(make, trained_names):
    model = make()
    names = {n for n, _ in model.named_parameters()}
    assert trained_names <= names and "a.weight" not in names
    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))


def test_pruned_weight_attribute_is_a_non_leaf_by_design():
    model = _pruned()
    assert not model.a.weight.is_leaf and model.a.weight.requires_grad
    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))


# -- shared and accumulated ---------------------------------------------------------------------------
class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.decoder = nn.Linear(3, 5, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, x):
        return self.decoder(self.embed(x))


def test_tied_embedding_and_decoder():
    model = Tied()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _assert_no_findings(_train(model, opt, loss_of=lambda m: m(torch.tensor([0, 3])).logsumexp(-1).sum()))


def test_gradient_accumulation_checked_at_the_step():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    events = []
    reports = []
    monitor = leafwatch.Monitor(model, opt, sinks=[events.append]).attach()
    for _ in range(STEPS):
        for _ in range(3):  # three micro-batches per optimizer step
            (model(_batch()).sum() / 3).backward()
        reports.append(leafwatch.audit(model, opt))
        opt.step()
        opt.zero_grad(set_to_none=True)
    reports.append(monitor.close())
    assert len(events) == STEPS
    _assert_no_findings(reports + [e.report for e in events])


class TopOneMoE(nn.Module):
    """Top-1 routing: each batch goes to one expert, so an expert can go unused in a step."""

    def __init__(self, experts: int = 3) -> None:
        super().__init__()
        self.router = nn.Linear(3, experts)
        self.experts = nn.ModuleList(nn.Linear(3, 1) for _ in range(experts))

    def forward(self, x):
        scores = self.router(x).softmax(-1)
        choice = scores.mean(0).argmax()
        return self.experts[int(choice)](x) * scores[:, choice : choice + 1]


def test_mixture_of_experts_with_unused_experts_is_at_most_intermittent():
    model = TopOneMoE()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports = []
    routed: list[int] = []
    with leafwatch.Monitor(model, opt, patience=4) as monitor:
        for step in range(8):
            opt.zero_grad(set_to_none=True)
            # Each step's batch favours one expert (the router's bias toward it is made large).
            with torch.no_grad():
                model.router.bias.copy_(torch.eye(3)[step % 3] * 10)
            model(_batch()).sum().backward()
            routed += [i for i, e in enumerate(model.experts) if e.weight.grad is not None]
            reports.append(monitor.check())
            opt.step()
        reports.append(monitor.close())
    assert routed == [0, 1, 2, 0, 1, 2, 0, 1], "each step uses one expert, every expert misses steps"
    _assert_nothing_above_info(reports)
    assert all(f.kind == "missing_grad" and f.status == "intermittent" for r in reports for f in r)


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(2, 3), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(3, 1))


def test_alternating_gan_optimizers_with_attach():
    gan = GAN()
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=1e-3)
    events = []
    audits = []
    monitor = leafwatch.Monitor(gan, [opt_g, opt_d], sinks=[events.append]).attach()
    for _ in range(STEPS):
        # Discriminator step: the generator's output is detached, so G gets no gradient here.
        opt_d.zero_grad(set_to_none=True)
        fake = gan.generator(torch.randn(4, 2)).detach()
        real = torch.randn(4, 3)
        (gan.discriminator(fake).mean() - gan.discriminator(real).mean()).backward()
        audits.append(leafwatch.audit(gan.discriminator, opt_d))
        opt_d.step()
        # Generator step: D's parameters get gradients too but opt_g steps only G.
        opt_g.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        (-gan.discriminator(gan.generator(torch.randn(4, 2))).mean()).backward()
        audits.append(leafwatch.audit(gan.generator, opt_g))
        opt_g.step()
    monitor.close()
    assert [e.optimizer for e in events] == [1, 0] * STEPS
    assert {n for e in events if e.optimizer == 0 for n in e.names} == {"generator.0.weight", "generator.0.bias"}
    _assert_no_findings(audits + [e.report for e in events] + [monitor.report])


@pytest.mark.parametrize("optimizer", [torch.optim.SparseAdam, torch.optim.SGD])
def test_sparse_embedding(optimizer):
    model = nn.Embedding(10, 3, sparse=True)
    opt = optimizer(model.parameters(), lr=0.1)
    reports = _train(model, opt, loss_of=lambda m: m(torch.tensor([1, 4])).sum(),
                     check_values_every_n_steps=1)
    assert model.weight.grad is not None and model.weight.grad.is_sparse
    _assert_no_findings(reports)


def test_sparse_embedding_with_a_nan_grad_is_still_found():
    model = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([1, 4])).sum().backward()
    model.weight.grad._values()[0, 0] = float("nan")
    assert leafwatch.audit(model, opt).names("nonfinite_grad") == {"weight"}


def test_batchnorm_buffers():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))


def test_module_to_float64_after_the_optimizer_was_built():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports = []
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(STEPS):
            if step == 1:
                model.to(torch.float64)
            dtype = torch.float64 if step >= 1 else torch.float32
            opt.zero_grad(set_to_none=True)
            model(_batch().to(dtype)).sum().backward()
            reports.append(leafwatch.audit(model, opt))
            reports.append(monitor.check())
            opt.step()
    assert model.a.weight.dtype == torch.float64
    _assert_no_findings(reports)


@pytest.mark.parametrize("eval_mode", [True, False])
def test_evaluation_under_no_grad_between_steps(eval_mode):
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.1), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def evaluate(step: int) -> None:
        model.train(not eval_mode)
        with torch.no_grad():
            model(_batch())
        model.train()

    _assert_no_findings(_train(model, opt, between_steps=evaluate))


def test_evaluation_between_forward_and_check():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_then_evaluate(m: nn.Module) -> torch.Tensor:
        loss = m(_batch()).sum()
        with torch.no_grad():
            m(_batch())  # a metric on another batch, still in training mode
        return loss

    _assert_no_findings(_train(model, opt, loss_of=loss_then_evaluate))


class StoresLosses(TwoLayer):
    """Keeps every step's loss in a list attribute, as Lightning modules often do."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []
        self.last_loss: torch.Tensor | None = None


def test_stored_losses_in_a_module_attribute_are_not_orphans():
    model = StoresLosses()

    def loss_of(m: StoresLosses) -> torch.Tensor:
        loss = m(_batch()).sum()
        m.outputs.append(loss)
        m.last_loss = loss
        return loss

    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_of=loss_of))
    assert len(model.outputs) == STEPS


def test_compiled_model():
    # The default inductor backend took about 90 s to compile this model on a loaded 2-core
    # machine; aot_eager (about 13 s) still runs the model through dynamo and AOT autograd.
    model = TwoLayer()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    _assert_no_findings(_train(compiled, opt))


class StoresLossesWithAnOrphan(StoresLosses):
    def __init__(self) -> None:
        super().__init__()
        self.temperature = torch.ones(1, requires_grad=True)

    def forward(self, x):
        return super().forward(x) * self.temperature


def test_stored_losses_are_not_orphans_even_when_they_depend_on_one():
    model = StoresLossesWithAnOrphan()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(_batch()).sum()
        loss.backward()
        model.outputs.append(loss)
    (finding,) = leafwatch.audit(model, opt).findings
    assert (finding.kind, finding.name) == ("orphan_tensor", "temperature")


def test_pruning_made_permanent_during_training():
    model = _pruned()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def make_permanent(step: int) -> None:
        if step == 0:
            nn.utils.prune.remove(model.a, "weight")

    _assert_no_findings(_train(model, opt, between_steps=make_permanent))
    assert isinstance(model.a.weight, nn.Parameter)


def test_lazy_modules_before_and_after_their_first_forward():
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU(), nn.LazyLinear(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = leafwatch.audit(model, opt)  # before any backward: one finding says so
    (nothing,) = before.by_kind("missing_grad")
    assert nothing.name == "<every trainable parameter>" and nothing.reason.name == "no_grad_at_all"
    assert set(nothing.aliases) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert {f.shape for f in before} == {None}
    model.extra = nn.LazyLinear(2)  # never materialized, not in the optimizer, no gradient: no finding
    report = leafwatch.audit(model, torch.optim.SGD([nn.Parameter(torch.ones(2, 3))], lr=0.1))
    assert report.names("not_in_optimizer") == set()
    del model.extra
    _assert_no_findings(_train(model, opt, loss_of=lambda m: m(torch.randn(4, 5)).sum()))


@pytest.mark.parametrize(
    ("module", "loss_of"),
    [
        (lambda: nn.LSTM(3, 4, num_layers=2, batch_first=True), lambda m: m(torch.randn(2, 5, 3))[0].sum()),
        (lambda: nn.GRU(3, 4, bidirectional=True), lambda m: m(torch.randn(5, 2, 3))[0].sum()),
        (lambda: nn.MultiheadAttention(4, 2), lambda m: m(*(torch.randn(5, 2, 4),) * 3)[0].sum()),
        (lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0), lambda m: m(torch.randn(5, 2, 4)).sum()),
        (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.GroupNorm(1, 2), nn.Flatten(), nn.Linear(18, 1)),
         lambda m: m(torch.randn(2, 1, 5, 5)).sum()),
    ],
)
def test_common_layers(module, loss_of):
    model = module()
    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_of=loss_of))


def test_mixed_precision_overflow_steps_skipped_by_the_grad_scaler():
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    events = []
    monitor = leafwatch.Monitor(model, opt, check_values_every_n_steps=1, sinks=[events.append]).attach()
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(_batch()).sum()).backward()
        if step == 1:
            model.a.weight.grad[0, 0] = float("inf")  # an overflow: the scaler skips this step
        scaler.step(opt)
        scaler.update()
    report = monitor.close()
    assert scaler.get_scale() == 2.0**15, "the overflow step was skipped"
    assert len(events) == STEPS - 1, "the skipped step is not checked"
    _assert_no_findings([report] + [e.report for e in events])


def test_half_precision_model_with_normalization_layers_kept_in_float32():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.LayerNorm(4), nn.Linear(4, 1)).to(torch.bfloat16)
    model[1].float()
    model[2].float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports = _train(model, opt, loss_of=lambda m: m(_batch().to(torch.bfloat16)).float().sum())
    _assert_no_findings(reports)


def test_learnable_parameter_held_outside_the_model():
    model = TwoLayer()
    temperature = nn.Parameter(torch.ones(1))  # the training loop owns it, not the model
    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.1)
    reports = _train(model, opt, loss_of=lambda m: (m(_batch()) / temperature).sum())
    _assert_no_findings(reports)


class Checkpointed(TwoLayer):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def forward(self, x):
        h = self.a(x)  # requires grad, so even the reentrant variant records the graph
        h = torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=self.use_reentrant)
        return self.b(h)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing(use_reentrant):
    model = Checkpointed(use_reentrant)
    _assert_no_findings(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))


def test_backbone_unfrozen_mid_run_and_added_to_the_optimizer():
    model = TwoLayer()
    model.a.requires_grad_(False)
    opt = torch.optim.SGD(model.b.parameters(), lr=0.1)

    def unfreeze(step: int) -> None:
        if step == 1:
            model.a.requires_grad_(True)
            opt.add_param_group({"params": list(model.a.parameters()), "lr": 0.01})

    _assert_no_findings(_train(model, opt, steps=12, between_steps=unfreeze))
