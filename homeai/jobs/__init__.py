"""Background jobs: scheduled indexing, summaries and hybrid search of the household's documents.

`service.JobService` is what the program (`homeai.app`) builds, and the API and `homeai index`
(`homeai.index_cli`) use; the other modules each own one step: extract (file -> text), chunking
(text -> chunks), indexer (a run), summarise (map-reduce), search (FTS5 + embeddings, fused), runs
(progress rows and the per-job lock). Jobs are a client of the service, as the protocols are: they
ask the model only through `service.work()` (`homeai.service.background`), never the engine.
"""
