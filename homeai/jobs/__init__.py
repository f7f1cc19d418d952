"""Background jobs: scheduled indexing, summaries and hybrid search of the household's documents.

`service.JobService` is what the app and the CLI use; the other modules each own one step:
extract (file -> text), chunking (text -> chunks), indexer (a run), summarise (map-reduce),
search (FTS5 + embeddings, fused), runs (progress rows and the per-job lock), schedule
(config string -> trigger), cli (`homeai index`). Jobs only submit requests to the engine.
"""
