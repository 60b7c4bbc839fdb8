//! Times `JsonObject::parse` on a body of many small members (not committed).
fn main() {
    for members in [10_000usize, 50_000, 100_000, 200_000] {
        let mut body = String::from("{");
        for i in 0..members {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&format!("\"k{i}\":0"));
        }
        body.push('}');
        let started = std::time::Instant::now();
        let ok = pinroute::policy::json::JsonObject::parse(body.as_bytes()).is_ok();
        println!(
            "{members} members, {} bytes: {:?} ({ok})",
            body.len(),
            started.elapsed()
        );
    }
}
