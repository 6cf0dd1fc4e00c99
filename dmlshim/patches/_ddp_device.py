"""DistributedDataParallel for DirectML modules: gradients all-reduced without device storage.

torch-directml's tensors are ``OpaqueTensorImpl``s: their storage cannot be read. DDP's C++
``Reducer`` asks ``grad.is_alias_of(bucket_view)`` for every gradient, which reads the storage,
so ``loss.backward()`` fails with "Cannot access storage of OpaqueTensorImpl" on the real wheel
(and on the emulator with its ``storage`` gap). :class:`DeviceDistributedDataParallel` is the
DDP a script gets instead on DirectML: a subclass of torch's, so ``isinstance`` checks,
``ddp.module``, ``no_sync()``, ``state_dict()`` keys (``module.``) and the attributes scripts
read are torch's, but it never builds a Reducer. What it does, in DDP's order:

* construction: rank 0's parameters and buffers are broadcast to every rank (one flat CPU
  tensor per dtype through the process group), as ``_sync_module_states`` does;
* forward: with ``broadcast_buffers`` (the default), rank 0's buffers are broadcast first,
  whenever the previous forward was followed by a synchronised backward (DDP's
  ``require_forward_param_sync``); inputs go to the device when ``device_ids`` named one;
* backward: a post-accumulate-grad hook on each parameter queues one callback at the end of
  the backward pass; it copies the gradients to the host, all-reduces them (SUM of
  ``grad / world_size``, DDP's order of operations) together with a used/unused flag per
  parameter, and copies the averages back. A parameter no rank used keeps ``grad=None``; one
  that some rank did not use gets the average of the others (``find_unused_parameters``
  semantics; without the flag torch would raise on such a model, here it simply works);
* ``no_sync()`` is torch's: the forward inside it marks the next backward as local.

Not available (they are defined by the Reducer): ``register_comm_hook``, ``join()`` with uneven
inputs, ``static_graph`` optimisations (accepted, nothing to optimise), gradient bucketing and
overlap (the all-reduce runs once, after the backward pass).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dmlshim import events

log = logging.getLogger("dmlshim")


def _flat_groups(tensors: Sequence[torch.Tensor]) -> Dict[torch.dtype, List[int]]:
    groups: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def broadcast_from_rank0(tensors: Sequence[torch.Tensor], group: Any) -> None:
    """Give every rank rank 0's values of ``tensors`` (device tensors), one collective per dtype."""
    if not tensors:
        return
    with torch.no_grad():
        for indices in _flat_groups(tensors).values():
            host = [tensors[i].detach().cpu().reshape(-1) for i in indices]
            flat = torch.cat(host) if len(host) > 1 else host[0].clone()
            dist.broadcast(flat, src=dist.get_global_rank(group, 0), group=group)
            offset = 0
            for i in indices:
                n = tensors[i].numel()
                tensors[i].copy_(flat[offset:offset + n].view(tensors[i].shape))
                offset += n


class DeviceDistributedDataParallel(DistributedDataParallel):
    """torch's DistributedDataParallel, minus the Reducer (see the module docstring)."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, *,
                 input_device: Optional[torch.device] = None, **_ignored: Any) -> None:
        torch.nn.Module.__init__(self)
        from torch.distributed.algorithms.join import Joinable

        Joinable.__init__(self)
        self.logger = None
        self.reducer = None
        self.process_group = process_group if process_group is not None \
            else dist.distributed_c10d._get_default_group()
        ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self.parameters_to_ignore = ignore
        self._module_parameters = [p for n, p in module.named_parameters() if n not in ignore]
        if not any(p.requires_grad for p in self._module_parameters):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have "
                               "any parameter that requires a gradient.")
        self.module = module
        self.device_ids = None  # what torch sets for a module that is not on a CUDA device
        self.output_device = None
        self.device = next(iter(self._module_parameters)).device
        self.device_type = self.device.type
        self.is_multi_device_module = len({p.device for p in self._module_parameters}) > 1
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = bool(static_graph)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.mixed_precision = None
        self.bucket_bytes_cap = int((bucket_cap_mb or 25) * 1024 * 1024)
        self.broadcast_bucket_size = int(250 * 1024 * 1024)
        self.modules_buffers = [b for n, b in module.named_buffers() if n not in ignore]
        self._input_device = input_device
        self._sync_next_backward = False
        self._queued = False
        self._world = dist.get_world_size(self.process_group)
        self._grad_params = [p for p in self._module_parameters if p.requires_grad]
        broadcast_from_rank0(list(self._module_parameters) + self.modules_buffers,
                             self.process_group)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in self._grad_params]

    # -- forward -------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.require_forward_param_sync and self.modules_buffers:
            broadcast_from_rank0(self.modules_buffers, self.process_group)
        if self._input_device is not None:
            inputs, kwargs = _to_device((inputs, kwargs), self._input_device)
        output = self.module(*inputs, **kwargs)
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        self.require_forward_param_sync = sync
        self._sync_next_backward = sync
        return output

    # -- backward ------------------------------------------------------------------------
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if self._sync_next_backward and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._all_reduce_grads)

    def _all_reduce_grads(self) -> None:
        self._queued = False
        self._sync_next_backward = False
        events.note("distributed.ddp.all_reduce")
        params = self._grad_params
        world = float(self._world)
        with torch.no_grad():
            for indices in _flat_groups(params).values():
                host = []
                for i in indices:
                    p = params[i]
                    g = p.grad
                    host.append(g.detach().cpu().reshape(-1) / world if g is not None
                                else torch.zeros(p.numel(), dtype=p.dtype))
                used = torch.tensor([float(params[i].grad is not None) for i in indices],
                                    dtype=host[0].dtype)
                flat = torch.cat(host + [used])
                dist.all_reduce(flat, group=self.process_group)
                counts = flat[-len(indices):]
                offset = 0
                for k, i in enumerate(indices):
                    p = params[i]
                    n = p.numel()
                    if counts[k].item() > 0:
                        value = flat[offset:offset + n].view(p.shape)
                        if p.grad is None:
                            p.grad = value.to(p.device)
                        else:
                            p.grad.copy_(value)
                    offset += n

    # -- what the Reducer would have done ----------------------------------------------------
    def register_comm_hook(self, state: object, hook: Any) -> None:
        raise NotImplementedError(
            "DistributedDataParallel.register_comm_hook: on DirectML dmlshim all-reduces "
            "gradients itself through the host (DirectML tensors have no storage for DDP's "
            "buckets), so communication hooks cannot run; remove the hook"
        )

    def _set_static_graph(self) -> None:
        self.static_graph = True

    def _get_ddp_logging_data(self) -> dict:
        return {"backend_name": "gloo", "dmlshim": "device DDP without Reducer"}

    def will_sync_module_buffers(self) -> bool:
        return (self.require_forward_param_sync and self.broadcast_buffers
                and len(self.modules_buffers) > 0)

    def _get_name(self) -> str:
        return "DistributedDataParallel"  # what the script's print(model) shows

    def __getstate__(self):
        raise RuntimeError("DistributedDataParallel on DirectML cannot be pickled; pickle "
                           "ddp.module instead")


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if isinstance(value, (list, tuple)):
        items = [_to_device(v, device) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return type(value)((k, _to_device(v, device)) for k, v in value.items())
    return value
