"""The notebooks' words, one module per topic as `tables/` and `plots/`: the sentences that state
a result, the notes beside a table and each notebook's conclusion (`lead`; 09's `conclusion`),
which the report shows first. They read what `tables/`, `throughput/` and `measure/` computed."""
