//! The desktop app's "go to" box in the menu bar: what the terminal explorer's `g` prompt
//! takes (an event, a time, `peak`, or `#N`, an event of the whole trace when a part is
//! shown), given to the model as that prompt's text; `g` puts the keyboard in it.

use eframe::egui;

use super::GuiApp;
use crate::model::state::{Prompt, PromptKind};
use crate::model::update::Msg;

impl GuiApp {
    pub(super) fn goto_box(&mut self, ui: &mut egui::Ui) {
        ui.separator();
        ui.label("go to");
        let field = egui::TextEdit::singleline(&mut self.goto_text)
            .hint_text("event, 1.5s, peak, #N of the whole trace")
            .desired_width(220.0);
        let response = ui.add(field);
        if self.focus_goto {
            response.request_focus();
            self.focus_goto = false;
        }
        if response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) {
            let text = std::mem::take(&mut self.goto_text);
            if let Some(r) = self.runs.first_mut() {
                r.state.prompt = Some(Prompt {
                    kind: PromptKind::Goto,
                    text,
                });
            }
            self.send(Msg::PromptSubmit);
        }
    }
}
