pub fn run(which: &str, _secs: f64) -> anyhow::Result<()> {
    anyhow::bail!("unknown bench {which}")
}
