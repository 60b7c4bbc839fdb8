//! Runs repeated in rounds: the difference of two processes' CPU moves by up to 0.06 ms per
//! request between single runs on this machine, so a cell run several times keeps its
//! median run by CPU per request, with every round's CPU beside it.

/// Of `runs`, one per cell (`same_cell`), in the order cells first ran: the median run by
/// `cpu` (the upper one of an even count), with what `merge` takes from all of the cell's
/// runs, given in the order they ran (every round's CPU, and every failure: a round that is
/// not the median still counts).
pub fn medians<T: Clone>(
    runs: Vec<T>,
    same_cell: impl Fn(&T, &T) -> bool,
    cpu: impl Fn(&T) -> Option<f64>,
    merge: impl Fn(&mut T, &[T]),
) -> Vec<T> {
    let mut cells: Vec<Vec<T>> = Vec::new();
    for run in runs {
        match cells
            .iter_mut()
            .find(|cell| cell.first().is_some_and(|c| same_cell(c, &run)))
        {
            Some(cell) => cell.push(run),
            None => cells.push(vec![run]),
        }
    }
    cells
        .into_iter()
        .filter_map(|cell| {
            let mut by_cpu: Vec<&T> = cell.iter().collect();
            by_cpu.sort_by(|a, b| cpu(a).unwrap_or(0.0).total_cmp(&cpu(b).unwrap_or(0.0)));
            let mut median = (*by_cpu.get(by_cpu.len() / 2)?).clone();
            merge(&mut median, &cell);
            Some(median)
        })
        .collect()
}

/// The rounds' CPU per request, lowest to highest, when there were several.
pub fn spread(rounds: &[f64]) -> Option<String> {
    let low = rounds.iter().copied().reduce(f64::min)?;
    let high = rounds.iter().copied().reduce(f64::max)?;
    (rounds.len() > 1).then(|| format!("{low:.3}–{high:.3}"))
}

/// The median of `values` (the upper one of an even count), their lowest and highest.
pub fn median_and_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64, f64)> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    Some((
        *values.get(values.len() / 2)?,
        *values.first()?,
        *values.last()?,
    ))
}

/// One process's CPU per request minus another's, from rounds in which the two ran one after
/// the other (whatever else weighed on the machine then weighed on both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Difference {
    /// The median of the round-by-round differences (the upper one of an even count), or
    /// the difference of the two runs without rounds.
    pub median: f64,
    /// The lowest and highest round's difference, with rounds.
    pub range: Option<(f64, f64)>,
}

impl Difference {
    /// `ours` minus `theirs`, round by round when both ran the same rounds (more than one),
    /// else `single`: the difference of the runs kept.
    pub fn of(ours: &[f64], theirs: &[f64], single: Option<f64>) -> Option<Difference> {
        if ours.len() < 2 || ours.len() != theirs.len() {
            return single.map(|median| Difference {
                median,
                range: None,
            });
        }
        let (median, low, high) = median_and_range(ours.iter().zip(theirs).map(|(o, t)| o - t))?;
        Some(Difference {
            median,
            range: Some((low, high)),
        })
    }

    /// `0.022`, or with rounds `0.022 (-0.001 to 0.061)`.
    pub fn render(&self) -> String {
        match self.range {
            Some((low, high)) => format!("{:.3} ({low:.3} to {high:.3})", self.median),
            None => format!("{:.3}", self.median),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_with_rounds_is_their_median_difference_with_its_range() {
        let paired = Difference::of(&[0.52, 0.60, 0.50], &[0.47, 0.48, 0.40], Some(0.0)).unwrap();
        assert!(
            (paired.median - 0.10).abs() < 1e-9,
            "{paired:?}: 0.05, 0.12, 0.10"
        );
        let (low, high) = paired.range.unwrap();
        assert!(
            (low - 0.05).abs() < 1e-9 && (high - 0.12).abs() < 1e-9,
            "{paired:?}"
        );
        assert_eq!(paired.render(), "0.100 (0.050 to 0.120)");
        let single = Difference::of(&[0.3], &[0.2], Some(0.1)).unwrap();
        assert_eq!((single.range, single.render().as_str()), (None, "0.100"));
        assert_eq!(
            Difference::of(&[0.3, 0.4], &[0.2], Some(0.05)).map(|d| d.median),
            Some(0.05),
            "rounds that do not pair: the runs kept"
        );
        assert_eq!(Difference::of(&[], &[], None), None);
    }

    #[test]
    fn each_cell_keeps_its_median_and_an_even_count_the_upper_one() {
        let runs = vec![
            ("a", 0.30),
            ("b", 0.10),
            ("a", 0.20),
            ("b", 0.40),
            ("a", 0.25),
        ];
        let kept = medians(
            runs.into_iter()
                .map(|(cell, cpu)| (cell, cpu, vec![]))
                .collect(),
            |x, y| x.0 == y.0,
            |run| Some(run.1),
            |median, cell| median.2 = cell.iter().map(|run| run.1).collect(),
        );
        assert_eq!(
            kept,
            vec![
                ("a", 0.25, vec![0.30, 0.20, 0.25]),
                ("b", 0.40, vec![0.10, 0.40])
            ]
        );
        assert_eq!(spread(&kept[0].2).as_deref(), Some("0.200–0.300"));
        assert_eq!(spread(&[0.2]), None);
    }
}
