//! Plain aligned text tables for human output.

/// A table of text cells printed with columns padded to their widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders with two-space indentation and two spaces between columns.
    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::from("  ");
            for (i, cell) in row.iter().enumerate().take(cols) {
                if i + 1 == cols {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}
