"""region: softmax
expect: values
why: exp(x - logsumexp(x)) is the same function, but at large logits (the offset profile: 1024 +- 1) the
subtraction of two nearly equal numbers of magnitude 1024 loses |x| * eps of absolute accuracy, 3e-5 relative,
over the 1e-5 contract; the original subtracts the row max, which is exact for nearby values. It also maps an
+inf logit's row to zeros and NaN where the original gives NaN."""
import torch


def candidate(x):
    return torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True))
