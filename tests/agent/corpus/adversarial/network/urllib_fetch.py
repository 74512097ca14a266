"""region: softmax
expect: sandbox, load
why: fetches a URL at import."""
import urllib.request

urllib.request.urlopen("http://example.com", timeout=2)


def candidate(x):
    return x
