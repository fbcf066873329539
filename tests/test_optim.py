"""Optimizers against torch.optim (SGD, Adam, AdamW, Muon) and a float64 numpy LAMB and Muon; kernels compiled once per
step shape."""

import numpy as np
import pytest
import torch

import ember.engine.realize as realize
import ember.schedule.cache as cache
import ember.schedule.kernelize as kernelize
from ember import Tensor, dtypes
from ember.nn.optim import LAMB, SGD, Adam, AdamW, Muon, Optimizer

SHAPES = [(4, 3), (3,), (2, 2, 5)]
STEPS = 10

SGD_CASES = [dict(lr=0.01), dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9, dampening=0.3),
             dict(lr=0.05, momentum=0.8, nesterov=True), dict(lr=0.1, weight_decay=0.1),
             dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
             dict(lr=0.1, momentum=0.5, dampening=0.5, weight_decay=0.2)]
ADAM_CASES = [dict(), dict(lr=0.01), dict(lr=0.01, weight_decay=0.1), dict(lr=0.02, b1=0.5, b2=0.9, eps=1e-6),
              dict(lr=0.1, b1=0.0, b2=0.99)]
ADAMW_CASES = [dict(), dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, weight_decay=0.0),
               dict(lr=0.05, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.5)]
CASES = ([(SGD, torch.optim.SGD, kw) for kw in SGD_CASES] + [(Adam, torch.optim.Adam, kw) for kw in ADAM_CASES]
         + [(AdamW, torch.optim.AdamW, kw) for kw in ADAMW_CASES])


def torch_kwargs(kw: dict) -> dict:
    """ember names Adam's betas b1 and b2, as tinygrad does; torch takes a tuple."""
    out = {k: v for k, v in kw.items() if k not in ("b1", "b2")}
    if "b1" in kw or "b2" in kw: out["betas"] = (kw.get("b1", 0.9), kw.get("b2", 0.999))
    return out


def case_id(case: tuple) -> str:
    return f"{case[0].__name__}-" + "-".join(f"{k}={v}" for k, v in case[2].items())


def initial_params(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def gradient_sequence(seed: int = 1) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_optimizer_matches_torch_given_gradients(case):
    ours, theirs, kw = case
    params = [Tensor(p) for p in initial_params()]
    torch_params = [torch.tensor(p, requires_grad=True) for p in initial_params()]
    opt, torch_opt = ours(params, **kw), theirs(torch_params, foreach=False, **torch_kwargs(kw))
    for grads in gradient_sequence():
        for p, tp, g in zip(params, torch_params, grads):
            p.grad, tp.grad = Tensor(g), torch.tensor(g)
        opt.step()
        torch_opt.step()
    for p, tp in zip(params, torch_params):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [CASES[2], CASES[9], CASES[13]], ids=case_id)
def test_optimizer_matches_torch_training_a_layer(case):
    """Gradients from backward() of the same loss on both sides: the full step, forward to update, as one schedule."""
    ours, theirs, kw = case
    rng = np.random.default_rng(2)
    x_np, y_np = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    w_np, b_np = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    w, b = Tensor(w_np), Tensor(b_np)
    tw, tb = torch.tensor(w_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    opt, torch_opt = ours([w, b], **kw), theirs([tw, tb], foreach=False, **torch_kwargs(kw))
    x, y, tx, ty = Tensor(x_np), Tensor(y_np), torch.tensor(x_np), torch.tensor(y_np)
    for _ in range(STEPS):
        opt.zero_grad()
        ((x @ w + b - y).square().mean()).backward()
        opt.step()
        torch_opt.zero_grad()
        ((tx @ tw + tb - ty).square().mean()).backward()
        torch_opt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-6, atol=1e-6)


def lamb_reference(params: list[np.ndarray], grads: list[list[np.ndarray]], lr: float = 0.001, b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False) -> list:
    """LAMB as published (You et al. 2019, Algorithm 2), in float64, one trust ratio per parameter tensor."""
    ws = [p.astype(np.float64) for p in params]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64)
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat, v_hat = ms[i] / (1 - b1 ** t), vs[i] / (1 - b2 ** t)
            r = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * ws[i]
            w_norm, r_norm = np.linalg.norm(ws[i]), np.linalg.norm(r)
            trust = 1.0 if adam or w_norm == 0 or r_norm == 0 else w_norm / r_norm
            ws[i] = ws[i] - lr * trust * r
    return ws


LAMB_CASES = [dict(), dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, b1=0.8, b2=0.99, eps=1e-8),
              dict(lr=0.01, weight_decay=0.1, adam=True)]


@pytest.mark.parametrize("kw", LAMB_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_lamb_matches_float64_reference(kw, dtype, tol):
    start = initial_params()
    start[1] = np.zeros_like(start[1])  # ||w|| = 0: the trust ratio is 1
    grads = gradient_sequence()
    grads[0][2] = np.zeros_like(grads[0][2])  # a zero update on step 1 for the third parameter: ratio 1 again
    params = [Tensor(p.astype(dtype)) for p in start]
    opt = LAMB(params, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads): p.grad = Tensor(g.astype(dtype))
        opt.step()
    for p, want in zip(params, lamb_reference(start, grads, **kw)):
        np.testing.assert_allclose(p.numpy(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, dampening=0.1), lambda ps: Adam(ps),
                                  lambda ps: AdamW(ps), lambda ps: LAMB(ps, weight_decay=0.01)],
                         ids=["SGD", "Adam", "AdamW", "LAMB"])
def test_kernels_compile_once_then_are_reused(make):
    """Step counts and bias corrections live in tensors, so step 3 onward compiles nothing new."""
    x_np = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    w, x = Tensor(np.ones((8, 4), np.float32)), Tensor(x_np)
    opt = make([w])
    compiled = []
    for _ in range(6):
        opt.zero_grad()
        (x @ w).relu().sum().backward()
        opt.step()
        compiled.append(len(realize._runners))
    assert compiled[2:] == [compiled[1]] * 4, f"kernels compiled after each step: {compiled}"


def test_step_realizes_params_and_state_in_one_schedule(monkeypatch):
    w = Tensor(np.ones((3, 2), np.float32))
    opt = Adam([w], lr=0.1)
    w.grad = Tensor(np.full((3, 2), 0.5, np.float32))
    schedules = []
    create = cache.schedule  # what Tensor.realize calls (a template, or kernelize.create_schedule)
    monkeypatch.setattr(cache, "schedule", lambda *args: schedules.append(args) or create(*args))
    loss = (w * w.grad).sum()
    realized = opt.step(loss)
    assert len(schedules) == 1 and kernelize.is_buffer_view(loss.uop) and loss.item() == 3.0
    assert {id(t) for t in realized} == {id(t) for t in [w, opt.t, *opt.m, *opt.v]}
    assert all(kernelize.is_buffer_view(t.uop) for t in realized), "step left lazy tensors behind"
    assert opt.t.item() == 1


def test_a_loss_backward_was_called_on_is_realized_with_the_step(monkeypatch):
    """torch's order (backward, step, then read the loss): the loss is computed in the step's schedule, from the
    parameters before the update, not again afterwards from the updated ones."""
    x, w = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((2, 2), np.float32)
    tw = torch.tensor(w, requires_grad=True)
    want = ((torch.tensor(x) @ tw).relu() ** 2).mean()
    want.backward()
    ew = Tensor(w, requires_grad=True)
    opt = SGD([ew], lr=0.1)
    loss = ((Tensor(x) @ ew).relu() ** 2).mean()
    loss.backward()
    opt.step()
    assert kernelize.is_buffer_view(loss.uop), "the loss was left for a second schedule"
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(ew.numpy(), w - 0.1 * tw.grad.numpy(), rtol=1e-6)


def test_zero_grad_forgets_gradients_and_step_needs_them():
    w = Tensor([1.0, 2.0])
    opt = SGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.zero_grad()
    assert w.grad is None
    with pytest.raises(RuntimeError, match=r"SGD.step: parameters \[0\] have no gradient"):
        opt.step()


def test_optimizer_takes_undecided_tensors_and_skips_frozen_ones():
    """requires_grad None (a new layer's parameter) becomes True; False marks a buffer: realized, not updated."""
    trained, frozen = Tensor([1.0, 2.0]), Tensor([3.0]).requires_grad_(False)
    opt = SGD([trained, frozen, trained], lr=0.5)
    assert trained.requires_grad and opt.params == [trained] and opt.buffers == [frozen]
    frozen.assign(frozen * 2)
    (trained * trained).sum().backward()
    opt.step()
    assert trained.tolist() == [0.0, 0.0] and frozen.tolist() == [6.0]


def test_optimizer_needs_a_tensor_to_optimize():
    with pytest.raises(ValueError, match="SGD: got no tensor to optimize"):
        SGD([Tensor([1.0]).requires_grad_(False)])


def test_sgd_rejects_nesterov_without_momentum():
    with pytest.raises(ValueError, match="SGD: Nesterov momentum needs momentum > 0 and dampening = 0"):
        SGD([Tensor([1.0])], nesterov=True)


def test_learning_rate_is_a_tensor_that_can_change_without_recompiling():
    w = Tensor([1.0, 1.0])
    opt = SGD([w], lr=0.5)
    for lr in (0.5, 0.25):
        opt.lr.assign(Tensor(lr, dtype=dtypes.float64)).realize()
        w.grad = Tensor([1.0, 2.0])
        opt.step()
    assert w.tolist() == [1.0 - 0.5 - 0.25, 1.0 - 1.0 - 0.5]


def test_optimizer_base_has_no_update_rule():
    opt = Optimizer([Tensor([1.0])], lr=0.1)
    opt.params[0].grad = Tensor([1.0])
    with pytest.raises(NotImplementedError):
        opt.step()


# ---- Muon ----------------------------------------------------------------------------------------------------------

MUON_SHAPES = [(4, 6), (7, 3), (5, 5)]
MUON_CASES = [dict(), dict(lr=0.02, nesterov=False, weight_decay=0.0),
              dict(lr=0.05, momentum=0.9, adjust_lr_fn="match_rms_adamw"),
              dict(lr=0.01, adjust_lr_fn="original", ns_steps=3, eps=1e-5, ns_coefficients=(2.0, -1.5, 0.5))]


def muon_run(kw: dict, steps: int = 5) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(5)
    start = [rng.standard_normal(s).astype(np.float32) for s in MUON_SHAPES]
    return start, [[rng.standard_normal(s).astype(np.float32) for s in MUON_SHAPES] for _ in range(steps)]


@pytest.mark.parametrize("kw", MUON_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_muon_matches_torch_step_for_step(kw):
    """Newton-Schulz in bfloat16 as torch, each product accumulated in float32 and rounded once: the same bits."""
    start, grads = muon_run(kw)
    params, torch_params = [Tensor(p) for p in start], [torch.tensor(p, requires_grad=True) for p in start]
    opt, torch_opt = Muon(params, **kw), torch.optim.Muon(torch_params, **kw)
    for step_grads in grads:
        for p, tp, g in zip(params, torch_params, step_grads): p.grad, tp.grad = Tensor(g), torch.tensor(g)
        opt.step()
        torch_opt.step()
        for p, tp in zip(params, torch_params):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-6, atol=1e-6)


def muon_reference(params: list[np.ndarray], grads: list[list[np.ndarray]], lr: float = 1e-3,
                   weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                   ns_coefficients: tuple = (3.4445, -4.7750, 2.0315), eps: float = 1e-7, ns_steps: int = 5,
                   adjust_lr_fn: str | None = None) -> list[np.ndarray]:
    """Muon as published (Jordan et al. 2024, with torch's momentum as lerps and lr adjustments), in float64."""
    a, b, c = ns_coefficients
    ws = [p.astype(np.float64) for p in params]
    bufs = [np.zeros_like(w) for w in ws]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64)
            bufs[i] = momentum * bufs[i] + (1 - momentum) * g
            update = (1 - momentum) * g + momentum * bufs[i] if nesterov else bufs[i]
            x = update.T if update.shape[0] > update.shape[1] else update
            x = x / max(np.linalg.norm(x), eps)
            for _ in range(ns_steps):
                gram = x @ x.T
                x = a * x + (b * gram + c * gram @ gram) @ x
            x = x.T if update.shape[0] > update.shape[1] else x
            rows, cols = ws[i].shape
            adamw_like = adjust_lr_fn == "match_rms_adamw"
            ratio = 0.2 * np.sqrt(max(rows, cols)) if adamw_like else np.sqrt(max(1, rows / cols))
            ws[i] = ws[i] * (1 - lr * weight_decay) - lr * ratio * x
    return ws


@pytest.mark.parametrize("kw", MUON_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("float64", 1e-10)])
def test_muon_with_exact_newton_schulz_matches_float64_reference(kw, dtype, tol):
    start, grads = muon_run(kw)
    params = [Tensor(p.astype(dtype)) for p in start]
    opt = Muon(params, ns_dtype=dtypes.float32 if dtype == "float32" else dtypes.float64, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads): p.grad = Tensor(g.astype(dtype))
        opt.step()
    for p, want in zip(params, muon_reference(start, grads, **kw)):
        np.testing.assert_allclose(p.numpy(), want, rtol=tol, atol=tol)


def test_muon_orthogonalizes_the_update():
    """With zero weight decay and momentum, one step moves the weight by lr times a matrix whose singular values
    lie near 1 (the quintic iteration leaves them in about [0.7, 1.2])."""
    w = Tensor(np.zeros((6, 4), np.float32))
    opt = Muon([w], lr=1.0, momentum=0.0, weight_decay=0.0, nesterov=False, ns_dtype=dtypes.float32)
    w.grad = Tensor(np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32))
    opt.step()
    singular = np.linalg.svd(w.numpy() / np.sqrt(6 / 4), compute_uv=False)
    assert singular.min() > 0.6 and singular.max() < 1.25, singular


def test_muon_checks_its_arguments():
    with pytest.raises(ValueError, match=r"Muon: only 2-d parameters are supported, got one of shape \(3,\)"):
        Muon([Tensor(np.ones((2, 2), np.float32)), Tensor([1.0, 2.0, 3.0])])
    with pytest.raises(ValueError, match="Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw'"):
        Muon([Tensor(np.ones((2, 2), np.float32))], adjust_lr_fn="fast")
    with pytest.raises(ValueError, match=r"Muon: lr \(-1\), momentum"):
        Muon([Tensor(np.ones((2, 2), np.float32))], lr=-1)


def test_muon_kernels_compile_once_then_are_reused():
    x_np = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    w, x = Tensor(np.ones((8, 4), np.float32)), Tensor(x_np)
    opt = Muon([w], lr=0.01)
    compiled = []
    for _ in range(5):
        opt.zero_grad()
        (x @ w).relu().sum().backward()
        opt.step()
        compiled.append(len(realize._runners))
    assert compiled[1:] == [compiled[0]] * 4, f"kernels compiled after each step: {compiled}"
