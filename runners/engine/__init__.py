"""The generation engine: requests, sampling parameters, paged KV cache, scheduler, step loop."""
