"""Matchers shared by several passes (RMSNorm in its spellings, the key-mask window of joint attention)."""
