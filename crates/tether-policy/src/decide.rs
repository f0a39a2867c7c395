//! Deciding one request: the request's slice (or the verdict fixed for its
//! shape at load), and otherwise a Cedar evaluation of that slice on the
//! request's entities and context. Anything that cannot be evaluated denies.
//!
//! Never here: anything that happens at load (`load`, `slice`), or what
//! the kernel does with the verdict.

use crate::annotations::verdict_from;
use crate::entities::{request_context, BindingEnt};
use crate::slice::{shape_index, Slice};
use crate::{input, Action, ControlPolicy, Subject, Verdict};
use cedar_policy::{Request, RestrictedExpression};
use serde_json::Value;
use std::sync::Arc;

impl ControlPolicy {
    /// Decides one request on binding `binding` of device `device` (indices
    /// in the cell's order). Never panics; anything that cannot be evaluated
    /// denies.
    pub fn decide(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
        input: &Value,
    ) -> Verdict {
        self.decide_shared(who, action, device, binding, input)
            .0
            .into_owned()
    }

    /// [`ControlPolicy::decide`] with the verdict's evidence form
    /// ([`Verdict::to_json`]). A verdict the request's shape fixes (worked
    /// out at load) is lent, with its JSON shared, so the common request
    /// builds neither.
    pub fn decide_shared(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
        input: &Value,
    ) -> (std::borrow::Cow<'_, Verdict>, Arc<Value>) {
        use std::borrow::Cow;
        let verdict = match self.slice_for(who, action, device, binding) {
            Ok((b, slice)) => {
                if let (Some(fixed), Some(json)) = (&slice.fixed, &slice.fixed_json) {
                    return (Cow::Borrowed(fixed), Arc::clone(json));
                }
                self.decide_on(slice, who, action, b, input)
            }
            Err(deny) => deny,
        };
        let json = Arc::new(verdict.to_json());
        (Cow::Owned(verdict), json)
    }

    /// The binding and the policy slice of a request's shape; a deny when
    /// either is unknown.
    fn slice_for(
        &self,
        who: &Subject<'_>,
        action: Action,
        device: usize,
        binding: usize,
    ) -> Result<(&BindingEnt, &Slice), Verdict> {
        let Some(b) = self.bindings.get(device).and_then(|d| d.get(binding)) else {
            return Err(Verdict::deny(
                Vec::new(),
                "the binding is unknown to the policy".into(),
            ));
        };
        let Some(slice) = self
            .slices
            .get(device)
            .and_then(|d| d.get(binding))
            .and_then(|shapes| shapes.get(shape_index(who.kind, action)))
        else {
            return Err(Verdict::deny(
                Vec::new(),
                "no policy slice for this request".into(),
            ));
        };
        Ok((b, slice))
    }

    pub(crate) fn decide_on(
        &self,
        slice: &Slice,
        who: &Subject<'_>,
        action: Action,
        b: &BindingEnt,
        input: &Value,
    ) -> Verdict {
        if let Some(fixed) = &slice.fixed {
            return fixed.clone();
        }
        match self.evaluate(slice, who, action, b, input) {
            Ok(v) => v,
            Err(why) => Verdict::deny(
                Vec::new(),
                format!("the policy could not be evaluated: {why}"),
            ),
        }
    }

    fn evaluate(
        &self,
        slice: &Slice,
        who: &Subject<'_>,
        action: Action,
        b: &BindingEnt,
        input: &Value,
    ) -> Result<Verdict, String> {
        let (principal_uid, entities) = self.entities_for(who, b)?;
        let context = match &slice.input_type {
            // Nothing in the slice reads the input: the binding's context
            // with an empty input, built once at load.
            None => b.context_without_input.clone(),
            Some(t) => {
                let input = input::convert(input, t, 0)?
                    .map_or_else(|| RestrictedExpression::new_record([]), Ok)
                    .map_err(|e| e.to_string())?;
                request_context(b, input)?
            }
        };
        let action_uid = match action {
            Action::Read => &self.actions[0],
            Action::Write => &self.actions[1],
            Action::Command => &self.actions[2],
        };
        let request = Request::new(
            principal_uid,
            action_uid.clone(),
            b.uid.clone(),
            context,
            None,
        )
        .map_err(|e| e.to_string())?;
        let response = self
            .authorizer
            .is_authorized(&request, &slice.set, &entities);
        let errors: Vec<String> = response
            .diagnostics()
            .errors()
            .map(|e| e.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        let mut determining: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| id.to_string())
            .collect();
        determining.sort();
        Ok(verdict_from(&self.meta, response.decision(), determining))
    }
}
