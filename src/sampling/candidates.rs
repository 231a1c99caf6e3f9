//! The candidate list every sampler stage reads and narrows (llama.cpp's
//! `llama_token_data_array`), with the sorting and softmax helpers the stages share.

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenData {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Candidates in their current order. `sorted` means descending by logit; `selected` is the
/// index the final stage picked.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    pub data: Vec<TokenData>,
    pub sorted: bool,
    pub selected: Option<usize>,
}

fn by_logit_desc(a: &TokenData, b: &TokenData) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit)
}

impl Candidates {
    pub fn from_logits(logits: &[f32]) -> Self {
        let data = logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| TokenData {
                id: id as u32,
                logit,
                p: 0.0,
            })
            .collect();
        Candidates {
            data,
            sorted: false,
            selected: None,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Keeps the `k` highest logits, in descending order.
    pub fn keep_top(&mut self, k: usize) {
        let k = k.min(self.data.len());
        if k < self.data.len() && k > 0 {
            self.data.select_nth_unstable_by(k - 1, by_logit_desc);
            self.data.truncate(k);
        }
        self.data.sort_by(by_logit_desc);
        self.sorted = true;
    }

    pub fn sort(&mut self) {
        if !self.sorted {
            self.keep_top(self.data.len());
        }
    }

    /// Probabilities from logits, after sorting when `do_sort`.
    pub fn softmax(&mut self, do_sort: bool) {
        if self.data.is_empty() {
            return;
        }
        if do_sort {
            self.sort();
        }
        let max_l = if self.sorted {
            self.data[0].logit
        } else {
            self.data
                .iter()
                .fold(f32::NEG_INFINITY, |m, t| m.max(t.logit))
        };
        let mut sum = 0.0f32;
        for t in &mut self.data {
            t.p = (t.logit - max_l).exp();
            sum += t.p;
        }
        for t in &mut self.data {
            t.p /= sum;
        }
    }

    /// Temperature scaling; `temp <= 0` keeps only the first highest logit (greedy).
    pub fn scale_temperature(&mut self, temp: f32) {
        if self.data.is_empty() {
            return;
        }
        if temp <= 0.0 {
            let mut max_i = 0;
            let mut max_l = self.data[0].logit;
            for i in 1..self.data.len() {
                if self.data[i].logit > max_l {
                    self.data[max_i].logit = f32::NEG_INFINITY;
                    max_i = i;
                    max_l = self.data[i].logit;
                } else {
                    self.data[i].logit = f32::NEG_INFINITY;
                }
            }
            return;
        }
        for t in &mut self.data {
            t.logit /= temp;
        }
    }

    /// Sorts by probability, descending, keeping track of the selected token (what upstream
    /// reports as post-sampling probabilities).
    pub fn sort_by_probability(&mut self) {
        if self.sorted {
            return;
        }
        let picked = self.selected.map(|i| self.data[i].id);
        self.data.sort_by(|a, b| b.p.total_cmp(&a.p));
        if let Some(id) = picked {
            self.selected = self.data.iter().position(|t| t.id == id);
        }
        self.sorted = true;
    }
}
