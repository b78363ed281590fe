"""Human review: the stratified review sample, answers queued in an inbox and merged into the labels
file each iteration reads, and the agreement between people and the verifiers. Pure core: no Prefect."""
