"""interlock's continuous batching: requests, sampling parameters, paged KV cache, scheduler,
and the step loop that runs them through a runner."""
