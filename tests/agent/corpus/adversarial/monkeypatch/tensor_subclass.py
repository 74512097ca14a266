"""region: softmax
expect: runs
why: returns a tensor subclass whose __torch_function__ would run in whatever thread touches it."""
import torch


class Sneaky(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def candidate(x):
    return torch.softmax(x, -1).as_subclass(Sneaky)
