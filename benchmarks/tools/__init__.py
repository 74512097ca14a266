"""Tools for reading runs and driving the GPU machine: clocks, SASS counts, kernel comparison, device scripts."""
