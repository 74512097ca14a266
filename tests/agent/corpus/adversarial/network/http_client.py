"""region: gelu_bias
expect: sandbox, load
why: asks an HTTP server for the answer through http.client."""
import http.client

import torch


def candidate(b, x):
    connection = http.client.HTTPConnection("example.com", timeout=2)
    connection.request("GET", "/")
    return torch.nn.functional.gelu(x + b, approximate="tanh")
